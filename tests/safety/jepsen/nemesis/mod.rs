//! The nemesis: one fault at a time, chosen at random from a seeded generator, each recorded
//! with its start and end (and, when it aims at a holder, which one, as the lease status named
//! it), then healed before the next. Here the choice and the record; the faults in a module
//! per what they aim at: `holders`, `operator` (and the control plane), `leases`, `fences`.

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

mod fences;
mod holders;
mod leases;
mod operator;

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
}
