//! The nemesis: one fault at a time, chosen at random from a seeded generator, each recorded
//! with its start and end (and, when it aims at a holder, which one, as the lease status named
//! it), then healed before the next.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fenced_lease::api::FencedLease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use nix::sys::signal::Signal;
use rand::Rng;
use rand::rngs::StdRng;

use crate::cluster::{Cluster, LEASES, create_lease};
use crate::history::{Event, FaultKind, Recorder, Target};

/// How long faults last: the short profile keeps them near the minimum that still bites.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Multiplier of the random part of every fault's length (1.0 = long profile).
    pub spread: f64,
}

pub struct Nemesis<'a> {
    pub cluster: &'a Cluster,
    pub rec: Recorder,
    pub rng: StdRng,
    pub pace: Pace,
    /// When the run started, for the progress lines.
    pub started: std::time::Instant,
}

impl Nemesis<'_> {
    fn start(&self, kind: FaultKind, detail: String, target: Option<Target>) {
        let lease = target.as_ref().map(|t| t.lease.clone());
        self.start_on(kind, detail, target, lease);
    }

    fn start_on(
        &self,
        kind: FaultKind,
        detail: String,
        target: Option<Target>,
        lease: Option<String>,
    ) {
        eprintln!(
            "jepsen: {:>8.1}s  fault {}: {detail}",
            self.elapsed(),
            kind.name()
        );
        self.rec.record(Event::FaultStart {
            kind,
            detail,
            target,
            lease,
        });
    }

    fn end(&self, kind: FaultKind, detail: String) {
        self.rec.record(Event::FaultEnd { kind, detail });
    }

    fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// A random length between `min` and `min + spread * extra` seconds.
    fn secs(&mut self, min: f64, extra: f64) -> Duration {
        Duration::from_secs_f64(min + self.rng.random_range(0.0..=1.0) * extra * self.pace.spread)
    }

    pub async fn run(&mut self, kind: FaultKind) {
        match kind {
            FaultKind::PauseHolder => self.pause_holder().await,
            FaultKind::KillHolder => self.kill_holder().await,
            FaultKind::PartitionHolder => self.partition_holder().await,
            FaultKind::KillOperatorMidGrant => self.kill_operator_mid_grant().await,
            FaultKind::PauseOperator => self.pause_operator().await,
            FaultKind::PartitionOperator => self.partition_operator().await,
            FaultKind::KillLeader => self.kill_leader().await,
            FaultKind::RestartApiserver => self.restart("restart-apiserver", kind).await,
            FaultKind::RestartEtcd => self.restart("restart-etcd", kind).await,
            FaultKind::RecreateLease => self.recreate_lease(false).await,
            FaultKind::DeleteTokenRecords => self.recreate_lease(true).await,
            FaultKind::LowerDuration => self.lower_duration().await,
        }
    }

    /// A lease whose holder is a live holder process of ours (waiting for one, up to 15 s);
    /// with `want_waiter`, one with a waiting claim behind it if there is such; with `cli`,
    /// one held by `kubectl fence run` (true) or the library (false) if there is such.
    async fn held(&mut self, want_waiter: bool) -> Option<Target> {
        self.held_by(want_waiter, None).await
    }

    async fn held_by(&mut self, want_waiter: bool, cli: Option<bool>) -> Option<Target> {
        // Best: a holder just granted, so that the fault lands in the middle of its hold.
        let mut grants = self.cluster.grants.subscribe();
        let fresh = tokio::time::timeout(Duration::from_secs(8), async {
            loop {
                match grants.recv().await {
                    Ok(g)
                        if self.cluster.slot_of(&g.target.process).is_some()
                            && cli
                                .is_none_or(|cli| cli == g.target.process.starts_with("cli-"))
                            && (!want_waiter || g.waiting > 0) =>
                    {
                        return Some(g.target);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                    _ => {}
                }
            }
        })
        .await;
        if let Ok(Some(target)) = fresh {
            // A moment for the holder to learn of its grant and start working.
            let settle = f64::from(target.term) * self.rng.random_range(0.1..0.25);
            tokio::time::sleep(Duration::from_secs_f64(settle)).await;
            return Some(target);
        }
        let api = self.cluster.ns.api::<FencedLease>();
        let started = tokio::time::Instant::now();
        let mut fallback: Option<Target> = None;
        // The preferred kind of target for 5 s, then any; nothing after 15 s.
        while started.elapsed() < Duration::from_secs(15) {
            let mut preferred = vec![];
            if let Ok(list) = api.list(&ListParams::default()).await {
                for lease in list {
                    let Some(status) = lease.status else { continue };
                    let Some(holder) = status.holder else {
                        continue;
                    };
                    if self.cluster.slot_of(&holder.identity).is_none() {
                        continue;
                    }
                    let target = Target {
                        process: holder.identity.clone(),
                        lease: lease.metadata.name.clone().unwrap_or_default(),
                        claim: holder.claim.clone(),
                        token: status.fencing_token,
                        term: status
                            .lease_duration_seconds
                            .unwrap_or(lease.spec.lease_duration_seconds),
                    };
                    let kind_ok = cli.is_none_or(|cli| cli == target.process.starts_with("cli-"));
                    if kind_ok && (!want_waiter || status.waiting > 0) {
                        preferred.push(target);
                    } else {
                        fallback = Some(target);
                    }
                }
            }
            if !preferred.is_empty() {
                let i = self.rng.random_range(0..preferred.len());
                return Some(preferred.swap_remove(i));
            }
            if started.elapsed() > Duration::from_secs(5) && fallback.is_some() {
                return fallback;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        fallback
    }

    async fn pause_holder(&mut self) {
        let kind = FaultKind::PauseHolder;
        // Half the time `kubectl fence` itself: its CMD writes on while it is frozen.
        let cli = self.rng.random_bool(0.5);
        let Some(target) = self.held_by(true, Some(cli)).await else {
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
    async fn partition_holder(&mut self) {
        let kind = FaultKind::PartitionHolder;
        let target = self.held_by(true, Some(false)).await;
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

    async fn kill_holder(&mut self) {
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

    async fn kill_operator_mid_grant(&mut self) {
        let kind = FaultKind::KillOperatorMidGrant;
        let leader = self.cluster.leader().await;
        let mut grants = self.cluster.grants.subscribe();
        // The lease status of a grant was just written; the claim status and the rest are not.
        let grant = tokio::time::timeout(Duration::from_secs(15), grants.recv()).await;
        let victim = leader.unwrap_or_else(|| self.cluster.replicas[0].clone());
        victim.signal(Signal::SIGKILL);
        let what = match grant {
            Ok(Ok(g)) => format!(
                "just after the grant of {} (token {})",
                g.target.lease, g.target.token
            ),
            _ => "no grant seen within 15 s".into(),
        };
        self.start(
            kind,
            format!("SIGKILL {} {what}; restarted at once", victim.name),
            None,
        );
        let leader = self
            .cluster
            .wait_for_leader(None, Duration::from_secs(30))
            .await;
        self.end(kind, format!("leader: {leader:?}"));
    }

    async fn pause_operator(&mut self) {
        let kind = FaultKind::PauseOperator;
        let victim = self
            .cluster
            .leader()
            .await
            .unwrap_or_else(|| self.cluster.replicas[0].clone());
        let pause = self.secs(2.0, 6.0);
        let cut = self.rng.random_bool(0.5);
        self.start(
            kind,
            format!(
                "SIGSTOP {} for {pause:?}{}",
                victim.name,
                if cut { ", its connections dropped" } else { "" }
            ),
            None,
        );
        victim.signal(Signal::SIGSTOP);
        if cut {
            victim.proxy.cut();
        }
        tokio::time::sleep(pause).await;
        victim.proxy.heal();
        victim.signal(Signal::SIGCONT);
        let leader = self
            .cluster
            .wait_for_leader(None, Duration::from_secs(30))
            .await;
        self.end(kind, format!("SIGCONT {}; leader: {leader:?}", victim.name));
    }

    async fn partition_operator(&mut self) {
        let kind = FaultKind::PartitionOperator;
        let leader = self.cluster.leader().await;
        let all = leader.is_none() || self.rng.random_bool(0.5);
        let outage = self.secs(2.0, 6.0);
        let cut: Vec<_> = if all {
            self.cluster.replicas.clone()
        } else {
            leader.into_iter().collect()
        };
        let names: Vec<&str> = cut.iter().map(|r| r.name.as_str()).collect();
        self.start(
            kind,
            format!("cut {names:?} off the apiserver for {outage:?}"),
            None,
        );
        for replica in &cut {
            replica.proxy.cut();
        }
        tokio::time::sleep(outage).await;
        for replica in &cut {
            replica.proxy.heal();
        }
        let leader = self
            .cluster
            .wait_for_leader(None, Duration::from_secs(30))
            .await;
        self.end(kind, format!("healed; leader: {leader:?}"));
    }

    async fn kill_leader(&mut self) {
        let kind = FaultKind::KillLeader;
        let victim = self
            .cluster
            .leader()
            .await
            .unwrap_or_else(|| self.cluster.replicas[0].clone());
        victim.held_down.store(true, Ordering::SeqCst);
        victim.signal(Signal::SIGKILL);
        self.start(
            kind,
            format!(
                "SIGKILL the leader {}; kept down until another leads",
                victim.name
            ),
            None,
        );
        let leader = self
            .cluster
            .wait_for_leader(Some(&victim.name), Duration::from_secs(30))
            .await;
        victim.held_down.store(false, Ordering::SeqCst);
        self.end(
            kind,
            format!("new leader: {leader:?}; {} restarted", victim.name),
        );
    }

    async fn restart(&mut self, command: &str, kind: FaultKind) {
        self.start(kind, format!("hack/control-plane {command}"), None);
        let dir = self
            .cluster
            .kubeconfig
            .parent()
            .expect("control-plane dir")
            .to_path_buf();
        let script = crate::common::repo_root().join("hack/control-plane");
        let out = tokio::task::spawn_blocking({
            let command = command.to_string();
            move || restart_control_plane(&script, &dir, &command)
        })
        .await
        .expect("restart task");
        self.end(kind, out);
    }

    /// Deletes a lease and creates it again; with `records`, the operator's token records
    /// are deleted in between (a GitOps prune of its namespace).
    async fn recreate_lease(&mut self, records: bool) {
        let kind = if records {
            FaultKind::DeleteTokenRecords
        } else {
            FaultKind::RecreateLease
        };
        let (lease, duration) = LEASES[self.rng.random_range(0..LEASES.len())];
        let ns = &self.cluster.ns;
        let target = self.held(false).await.filter(|t| t.lease == lease);
        self.start_on(
            kind,
            format!(
                "delete lease {lease}{}, create it again",
                if records {
                    ", delete the operator's token records"
                } else {
                    ""
                }
            ),
            target,
            Some(lease.to_string()),
        );
        let api = ns.api::<FencedLease>();
        let _ = api.delete(lease, &DeleteParams::default()).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while tokio::time::Instant::now() < deadline
            && !matches!(api.get_opt(lease).await, Ok(None))
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut deleted = vec![];
        if records {
            let cms = ns.api::<ConfigMap>();
            if let Ok(list) = cms.list(&ListParams::default()).await {
                for cm in list {
                    let name = cm.metadata.name.unwrap_or_default();
                    if name.starts_with("fenced-lease-tokens.")
                        && cms.delete(&name, &DeleteParams::default()).await.is_ok()
                    {
                        deleted.push(name);
                    }
                }
            }
        }
        create_lease(ns, lease, duration).await;
        self.end(
            kind,
            format!("lease {lease} re-created; records deleted: {deleted:?}"),
        );
    }

    async fn lower_duration(&mut self) {
        let kind = FaultKind::LowerDuration;
        let target = self
            .held(false)
            .await
            .filter(|t| Cluster::term_of(&t.lease) > 1);
        let (lease, base) = match &target {
            Some(t) => (t.lease.clone(), Cluster::term_of(&t.lease)),
            None => ("c".to_string(), Cluster::term_of("c")),
        };
        let api = self.cluster.ns.api::<FencedLease>();
        let patch = |d: u64| Patch::Merge(serde_json::json!({"spec": {"leaseDurationSeconds": d}}));
        self.start_on(
            kind,
            format!(
                "lease {lease}: leaseDurationSeconds {base} -> 1 while held{}",
                target
                    .as_ref()
                    .map(|t| format!(" by {} (token {})", t.process, t.token))
                    .unwrap_or_default()
            ),
            target,
            Some(lease.clone()),
        );
        let lowered = api.patch(&lease, &PatchParams::default(), &patch(1)).await;
        let keep = self.secs(2.0 * base as f64 + 1.0, 2.0 * base as f64);
        tokio::time::sleep(keep).await;
        let restored = api
            .patch(&lease, &PatchParams::default(), &patch(base))
            .await;
        self.end(
            kind,
            format!(
                "lease {lease}: back to {base} s after {keep:?} (lowered: {}, restored: {})",
                lowered.is_ok(),
                restored.is_ok()
            ),
        );
    }
}

/// Runs `hack/control-plane <command>` on the control plane whose kubeconfig is in `dir`.
fn restart_control_plane(script: &Path, dir: &Path, command: &str) -> String {
    let started = std::time::Instant::now();
    match std::process::Command::new(script)
        .arg(command)
        .env("FL_CP_DIR", dir)
        .output()
    {
        Ok(out) if out.status.success() => format!("{command} took {:?}", started.elapsed()),
        Ok(out) => format!(
            "{command} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => format!("cannot run {command}: {e}"),
    }
}
