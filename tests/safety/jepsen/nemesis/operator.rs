//! Faults aimed at the operator and the control plane: a replica killed mid-grant, paused or
//! cut off, the leader killed, the apiserver or etcd restarted.

use super::*;

impl Nemesis<'_> {
    pub(super) async fn kill_operator_mid_grant(&mut self) {
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

    pub(super) async fn pause_operator(&mut self) {
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

    pub(super) async fn partition_operator(&mut self) {
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

    pub(super) async fn kill_leader(&mut self) {
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

    pub(super) async fn restart(&mut self, command: &str, kind: FaultKind) {
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
