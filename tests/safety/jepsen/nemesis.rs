//! The nemesis: one fault at a time, chosen at random from a seeded generator, each recorded
//! with its start and end (and, when it aims at a holder, which one, as the lease status named
//! it), then healed before the next.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fenced_lease::api::FencedLease;
use fenced_lease_operator::admission::shipped;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use nix::sys::signal::Signal;
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::json;

use crate::cluster::{Cluster, LEASES, all_leases, create_lease, fence_of};
use crate::collateral::FENCE_ONLY;
use crate::history::{Event, FaultKind, Recorder, Target};

/// How long faults last: the short profile keeps them near the minimum that still bites.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Multiplier of the random part of every fault's length (1.0 = long profile).
    pub spread: f64,
}

/// Which holders a fault may aim at, by the process names the runner gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pick {
    /// `kubectl fence run`.
    Cli,
    /// Any other: the Rust and Go libraries, and the followed Lease's client-go leaders.
    NotCli,
    /// A client-go leader of the followed Lease.
    Follow,
}

impl Pick {
    fn admits(self, process: &str) -> bool {
        match self {
            Pick::Cli => process.starts_with("cli-"),
            Pick::NotCli => !process.starts_with("cli-"),
            Pick::Follow => process.starts_with("follow-"),
        }
    }
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
            FaultKind::StripFinalizer => self.strip_finalizer().await,
            FaultKind::InvalidFence => self.invalid_fence().await,
        }
    }

    /// A lease whose holder is a live holder process of ours (waiting for one, up to 15 s);
    /// with `want_waiter`, one with a waiting claim behind it (or another candidate of a
    /// followed Lease) if there is such.
    async fn held(&mut self, want_waiter: bool) -> Option<Target> {
        self.held_by(want_waiter, None).await
    }

    /// [`Self::held`], held by the kind of holder `pick` admits if there is such.
    async fn held_by(&mut self, want_waiter: bool, pick: Option<Pick>) -> Option<Target> {
        // Best: a holder just granted, so that the fault lands in the middle of its hold.
        let mut grants = self.cluster.grants.subscribe();
        let fresh = tokio::time::timeout(Duration::from_secs(8), async {
            loop {
                match grants.recv().await {
                    Ok(g)
                        if self.cluster.slot_of(&g.target.process).is_some()
                            && pick.is_none_or(|p| p.admits(&g.target.process))
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
                    let kind_ok = pick.is_none_or(|p| p.admits(&target.process));
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
    async fn partition_holder(&mut self) {
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

impl Nemesis<'_> {
    /// Deletes a lease with its finalizer stripped, as an administrator does to a lease stuck
    /// in deletion (issue 38, item 5): a merge patch `metadata.finalizers: null`, then the
    /// delete (and the strip again if the operator put its finalizer back in between). While
    /// the lease is gone, what it fenced is written as cluster-admin and as a pod that holds
    /// nothing (no existing lease fences it: [`crate::collateral`]); the operator's admission
    /// objects of the lease are watched for (its delete event removes them); then the lease is
    /// created again. Any lease, `d` (Secrets, with a selector) included.
    async fn strip_finalizer(&mut self) {
        let kind = FaultKind::StripFinalizer;
        let leases = all_leases();
        let (lease, duration) = leases[self.rng.random_range(0..leases.len())];
        let ns = &self.cluster.ns;
        let target = if lease == FENCE_ONLY {
            None
        } else {
            self.held(false).await.filter(|t| t.lease == lease)
        };
        self.start_on(
            kind,
            format!(
                "lease {lease}: finalizers stripped, deleted; what it fenced written while it is gone; created again"
            ),
            target,
            Some(lease.to_string()),
        );
        let api = ns.api::<FencedLease>();
        let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        let pp = PatchParams::default();
        let mut how = match api.patch(lease, &pp, &strip).await {
            Ok(_) => "stripped, then deleted".to_string(),
            Err(e) => format!("the strip failed ({e}), deleted"),
        };
        if let Err(e) = api.delete(lease, &DeleteParams::default()).await {
            how.push_str(&format!(" (the delete failed: {e})"));
        }
        let started = tokio::time::Instant::now();
        let mut gone_after = None;
        while started.elapsed() < Duration::from_secs(30) {
            let (gone, finalized) = match api.get_opt(lease).await {
                Ok(None) => (true, false),
                Ok(Some(l)) => (false, l.metadata.finalizers.is_some_and(|f| !f.is_empty())),
                Err(_) => (false, false),
            };
            if gone {
                gone_after = Some(started.elapsed());
                break;
            }
            // The operator put its finalizer back before the delete: strip it again.
            if finalized && api.patch(lease, &pp, &strip).await.is_ok() {
                how = "stripped, deleted; its finalizer was back, stripped again".into();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let collateral = self.cluster.collateral.clone();
        let written = match gone_after {
            Some(_) => Some(collateral.write_gone(&self.rec, lease, 3).await),
            None => None,
        };
        let left = self
            .admission_objects_left(lease, Duration::from_secs(10))
            .await;
        create_lease(ns, lease, duration).await;
        self.end(
            kind,
            format!(
                "lease {lease}: {how}; gone after {gone_after:?}; written while gone (accepted / refused / no answer): {}; its admission objects: {left}; created again",
                written.map_or("-".into(), |w| format!(
                    "{} / {} / {}",
                    w.accepted, w.refused, w.failed
                )),
            ),
        );
    }

    /// Waits up to `within` for the kinds slots to stop listing the namespace for the kinds
    /// only lease `lease`, which is gone, fenced there; says how long it took, or what is left.
    async fn admission_objects_left(&self, lease: &str, within: Duration) -> String {
        let kinds = |name: &str| -> Vec<(String, String)> {
            let fence = fence_of(name);
            let resources = fence["resources"].as_array().cloned().unwrap_or_default();
            resources
                .iter()
                .map(|r| {
                    let field = |f: &str| r[f].as_str().unwrap_or_default().to_string();
                    (field("group"), field("resource"))
                })
                .collect()
        };
        let others: Vec<_> = all_leases()
            .into_iter()
            .filter(|(l, _)| *l != lease)
            .flat_map(|(l, _)| kinds(l))
            .collect();
        let alone: Vec<_> = kinds(lease)
            .into_iter()
            .filter(|k| !others.contains(k))
            .collect();
        let started = tokio::time::Instant::now();
        loop {
            let listed = self.slots_listing(&alone).await;
            if listed.is_empty() {
                return format!(
                    "the kinds only it fenced ({alone:?}) unlisted {:?} after the lease was gone",
                    started.elapsed()
                );
            }
            if started.elapsed() >= within {
                return format!("still listed {within:?} after the lease was gone: {listed:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The kinds slots that list the run's namespace for one of `kinds` (group, resource).
    async fn slots_listing(&self, kinds: &[(String, String)]) -> Vec<String> {
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(self.cluster.ns.client.clone());
        let mut listing = vec![];
        for name in shipped::slot_names() {
            let Ok(policy) = policies.get(&name).await else {
                listing.push(format!("({name} not read)"));
                continue;
            };
            if let Ok(Some(a)) = shipped::assignment(&policy)
                && a.namespaces.contains(&self.cluster.ns.name)
                && kinds.contains(&(a.kind.group.clone(), a.kind.resource.clone()))
            {
                listing.push(name);
            }
        }
        listing
    }

    /// Edits a lease's `spec.fence` (as cluster-admin) to values the schema refuses (issue 38,
    /// item 6, and kinds that may never be fenced), each of which must be refused at
    /// admission; and lease `d`'s selector to the largest the schema admits, which must be
    /// accepted and, by the operator, put in place (or its lease not granted: `d` has no
    /// claims, so what is watched is its kinds policy taking the new selector). Then both
    /// fences are put back. Every answer is recorded ([`Event::FenceEdit`]).
    async fn invalid_fence(&mut self) {
        let kind = FaultKind::InvalidFence;
        let leases = all_leases();
        let (lease, _) = leases[self.rng.random_range(0..leases.len())];
        self.start_on(
            kind,
            format!(
                "lease {lease}: spec.fence edited to invalid values; lease {FENCE_ONLY}: its selector to the largest the schema admits; then both put back"
            ),
            None,
            Some(lease.to_string()),
        );
        let api = self.cluster.ns.api::<FencedLease>();
        let invalid = invalid_fences(&fence_of(lease)["resources"]);
        let mut refused = 0;
        for (edit, value) in &invalid {
            let (accepted, answer) = replace_fence(&api, lease, &["fence"], value).await;
            refused += usize::from(!accepted);
            self.rec.record(Event::FenceEdit {
                lease: lease.to_string(),
                edit: format!("spec.fence: {edit}"),
                invalid: true,
                accepted,
                answer,
                in_force: None,
            });
        }
        let (accepted, in_force) = self.largest_selector_on_d(&api).await;
        // The collateral writer writes meanwhile, under the big selector's condition.
        tokio::time::sleep(self.secs(2.0, 3.0)).await;

        let mut healed = vec![];
        for name in [lease, FENCE_ONLY] {
            healed.push(put_fence_back(&api, name).await);
        }
        let back = self.fence_in_place(FENCE_ONLY).await;
        self.end(
            kind,
            format!(
                "{refused} of {} invalid edits of lease {lease} refused; the largest selector on {FENCE_ONLY}: accepted {accepted}, its kind listed in a kinds slot: {in_force:?}; {}; {FENCE_ONLY}'s kind listed after: {back}",
                invalid.len(),
                healed.join(", "),
            ),
        );
    }

    /// Valid: the largest selector the schema admits, on lease d; recorded. Whether it was
    /// accepted, and then whether it is in force.
    async fn largest_selector_on_d(&mut self, api: &Api<FencedLease>) -> (bool, Option<bool>) {
        let big = largest_selector();
        let (accepted, answer) = replace_fence(api, FENCE_ONLY, &["fence", "selector"], &big).await;
        // The selector is read from the lease itself, by the apiserver: in force while a kinds
        // slot lists the namespace for the lease's kind.
        let in_force = if accepted {
            Some(self.fence_in_place(FENCE_ONLY).await)
        } else {
            None
        };
        self.rec.record(Event::FenceEdit {
            lease: FENCE_ONLY.to_string(),
            edit: "spec.fence.selector: the largest the schema admits (16 matchLabels, 16 matchExpressions of 64 values, keys of 317 and values of 63 characters)".into(),
            invalid: false,
            accepted,
            answer: answer.chars().take(300).collect(),
            in_force,
        });
        (accepted, in_force)
    }

    /// Whether a kinds slot lists the run's namespace for lease `lease`'s kinds (waits up to
    /// 10 s for it).
    async fn fence_in_place(&self, lease: &str) -> bool {
        let fence = fence_of(lease);
        let kinds: Vec<(String, String)> = (fence["resources"].as_array().into_iter().flatten())
            .map(|r| {
                let field = |f: &str| r[f].as_str().unwrap_or_default().to_string();
                (field("group"), field("resource"))
            })
            .collect();
        let started = tokio::time::Instant::now();
        loop {
            let listed = !self.slots_listing(&kinds).await.is_empty();
            if listed || started.elapsed() > Duration::from_secs(10) {
                return listed;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The invalid values of a `spec.fence` whose kinds are `resources`, each with what is wrong.
fn invalid_fences(resources: &serde_json::Value) -> [(&'static str, serde_json::Value); 4] {
    [
        (
            "selector operator \"in\" (for In)",
            json!({"resources": resources, "selector": {"matchExpressions": [{"key": "app", "operator": "in", "values": ["x"]}]}}),
        ),
        (
            "selector value \"not a label value\"",
            json!({"resources": resources, "selector": {"matchLabels": {"app": "not a label value"}}}),
        ),
        (
            "kind coordination.k8s.io/leases",
            json!({"resources": [{"group": "coordination.k8s.io", "resource": "leases"}]}),
        ),
        (
            "kind events (core)",
            json!({"resources": [{"group": "", "resource": "events"}]}),
        ),
    ]
}

/// Puts lease `name`'s own `spec.fence` back (tried 20 times, 500 ms apart): what came of it.
async fn put_fence_back(api: &Api<FencedLease>, name: &str) -> String {
    let mut ok = false;
    for _ in 0..20 {
        if replace_fence(api, name, &["fence"], &fence_of(name))
            .await
            .0
        {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    format!("{name}: {}", if ok { "put back" } else { "NOT put back" })
}

/// Sets `spec.<path>` of lease `lease` to `value`, exactly (a read, then a replace on its
/// resourceVersion; read again on a conflict): whether the apiserver accepted it, and its
/// answer. Raw JSON, so that what the schema refuses reaches the apiserver as it is.
async fn replace_fence(
    api: &Api<FencedLease>,
    lease: &str,
    path: &[&str],
    value: &serde_json::Value,
) -> (bool, String) {
    let resource = ApiResource::erase::<FencedLease>(&());
    let raw: Api<DynamicObject> = Api::namespaced_with(
        api.clone().into_client(),
        api.namespace().unwrap_or_default(),
        &resource,
    );
    let mut answer = String::new();
    for _ in 0..5 {
        let mut object = match raw.get(lease).await {
            Ok(object) => object,
            Err(e) => return (false, format!("cannot read the lease: {e}")),
        };
        let mut at = &mut object.data["spec"];
        for key in &path[..path.len() - 1] {
            at = &mut at[*key];
        }
        at[path[path.len() - 1]] = value.clone();
        match raw.replace(lease, &PostParams::default(), &object).await {
            Ok(l) => {
                return (
                    true,
                    format!(
                        "accepted (resourceVersion {})",
                        l.metadata.resource_version.unwrap_or_default()
                    ),
                );
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                answer = format!("{} {}: {}", e.code, e.reason, e.message);
            }
            Err(kube::Error::Api(e)) => {
                let text = format!("{} {}: {}", e.code, e.reason, e.message);
                return (false, text.chars().take(400).collect());
            }
            Err(e) => return (false, format!("no answer: {e}")),
        }
    }
    (false, answer)
}

/// The largest `spec.fence.selector` the CRD's schema admits: 16 matchLabels and 16
/// matchExpressions (In, 64 values each), keys of 317 characters (a 253-character prefix),
/// values of 63. It selects none of the run's objects.
fn largest_selector() -> serde_json::Value {
    let prefix = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    let key = |tag: &str, i: usize| format!("{prefix}/{tag}{i:02}{}", "x".repeat(60));
    let value = |i: usize| format!("v{i:02}{}", "v".repeat(60));
    let labels: serde_json::Map<String, serde_json::Value> =
        (0..16).map(|i| (key("k", i), json!(value(i)))).collect();
    let expressions: Vec<serde_json::Value> = (0..16)
        .map(|i| {
            json!({
                "key": key("e", i),
                "operator": "In",
                "values": (0..64).map(value).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"matchLabels": labels, "matchExpressions": expressions})
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
