//! Faults aimed at a holder: paused, cut off from the apiserver, killed.

use super::*;

impl Nemesis<'_> {
    pub(super) async fn pause_holder(&mut self) {
        let kind = FaultKind::PauseHolder;
        // Two times in five `kubectl fence` itself (its CMD writes on while it is frozen), one
        // in five a client-go leader of the followed Lease (it writes on when it wakes, until
        // its elector notices).
        let pick = match self.rng.random_range(0..5) {
            0 | 1 => Pick::Cli,
            2 | 3 => Pick::NotCli,
            _ => Pick::Follow,
        };
        let Some(target) = self.held_by(true, Some(pick)).await else {
            self.start(kind, "no holder found to pause".into(), None);
            self.end(kind, String::new());
            return;
        };
        let Some(slot) = self.cluster.slot_of(&target.process) else {
            return;
        };
        let term = f64::from(target.term);
        let pause = self.secs(term * 1.2 + 0.3, term * 1.3);
        self.start(
            kind,
            format!(
                "SIGSTOP {} (lease {}, token {}) for {pause:?}",
                target.process, target.lease, target.token
            ),
            Some(target.clone()),
        );
        slot.signal(Signal::SIGSTOP);
        tokio::time::sleep(pause).await;
        slot.signal(Signal::SIGCONT);
        self.end(kind, format!("SIGCONT {}", target.process));
    }

    /// Not in the list: a library holder alone cut off from the apiserver past its
    /// lease, so that it loses the lease at its own deadline while the next holder is granted
    /// after the operator's expiry — the hand-over I9 leaves a margin for.
    pub(super) async fn partition_holder(&mut self) {
        let kind = FaultKind::PartitionHolder;
        let target = self.held_by(true, Some(Pick::NotCli)).await;
        let slot = target
            .as_ref()
            .and_then(|t| self.cluster.slot_of(&t.process))
            .filter(|s| s.proxy.is_some());
        let (Some(target), Some(slot)) = (target, slot) else {
            self.start(kind, "no library holder found to cut off".into(), None);
            self.end(kind, String::new());
            return;
        };
        let term = f64::from(target.term);
        let outage = self.secs(term * 1.5 + 0.5, term);
        self.start(
            kind,
            format!(
                "cut {} (lease {}, token {}) off the apiserver for {outage:?}",
                target.process, target.lease, target.token
            ),
            Some(target.clone()),
        );
        let proxy = slot.proxy.as_ref().expect("a library holder's proxy");
        proxy.cut();
        tokio::time::sleep(outage).await;
        proxy.heal();
        self.end(kind, format!("healed {}", target.process));
    }

    pub(super) async fn kill_holder(&mut self) {
        let kind = FaultKind::KillHolder;
        let mut grants = self.cluster.grants.subscribe();
        let Some(target) = self.held(true).await else {
            self.start(kind, "no holder found to kill".into(), None);
            self.end(kind, String::new());
            return;
        };
        let Some(slot) = self.cluster.slot_of(&target.process) else {
            return;
        };
        self.start(
            kind,
            format!(
                "SIGKILL {} (lease {}, token {}, term {} s)",
                target.process, target.lease, target.token, target.term
            ),
            Some(target.clone()),
        );
        slot.signal(Signal::SIGKILL);
        // Until the lease is granted again (the checker judges how soon), or long past due.
        let until = tokio::time::Instant::now()
            + Duration::from_secs(u64::try_from(target.term).unwrap_or(1) + 8);
        loop {
            tokio::select! {
                grant = grants.recv() => match grant {
                    Ok(g) if g.target.lease == target.lease && g.target.token > target.token => break,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                    _ => {}
                },
                () = tokio::time::sleep_until(until) => break,
            }
        }
        self.end(
            kind,
            format!("lease {} granted again, or gave up waiting", target.lease),
        );
    }
}
