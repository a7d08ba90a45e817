//! The keeper of the kinds slots: one task that brings every slot in line with the kinds the
//! served leases fence ([`slots::plan`]), then has the leases that waited on it reconciled.
//! It runs when a lease's kinds change or it goes, when a slot changes, and every five
//! minutes; a write that fails is retried with backoff, and until it succeeds the leases it
//! concerns say why they are not granted.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::shipped::{self, Assignment, slot_name};
use super::slots::{self, Slot, Wanted};
use super::{Admission, Kind};
use crate::error::{Result, timed};
use crate::names::LeaseKey;
use crate::scheduler::Scheduler;
use fenced_lease_api::{FencedLease, FencedResource};

/// How often the slots are brought in line when nothing asked.
const EVERY: Duration = Duration::from_secs(300);
/// Backoff after a failed update of a slot: doubled up to the last.
const BACKOFF: [Duration; 4] = [
    Duration::from_millis(100),
    Duration::from_millis(500),
    Duration::from_secs(2),
    Duration::from_secs(10),
];

/// The API the keeper writes through, and which namespaces it answers for (all when empty).
pub struct Writer {
    pub client: Client,
    pub timeout: Duration,
    pub namespaces: Vec<String>,
}

/// Keeps the slots in line with `leases` until `stop`, once `ready` (the caches have synced).
pub async fn run(
    admission: Admission,
    leases: Store<FencedLease>,
    writer: Writer,
    triggers: Scheduler<LeaseKey>,
    ready: impl Fn() -> bool,
    stop: CancellationToken,
) {
    let mut failures = 0usize;
    loop {
        let wait = match failures {
            0 => EVERY,
            n => BACKOFF[(n - 1).min(BACKOFF.len() - 1)],
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = admission.poke.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
        if !ready() {
            failures = failures.max(1); // look again soon
            continue;
        }
        match keep(&admission, &leases, &writer, &triggers).await {
            Ok(()) => {
                failures = 0;
                admission.lock().error = None;
            }
            Err(error) => {
                failures += 1;
                warn!(%error, failures, "cannot update the kinds slots; retrying with backoff");
                // A conflict is someone else's write the cache has not shown yet: no cause
                // for a lease to report.
                if !error.is_conflict() {
                    admission.lock().error = Some(error.to_string());
                }
                nudge(&admission, &leases, &triggers, None);
            }
        }
    }
}

/// One round: plan, write what differs, remember what was listed, reconcile who waited.
async fn keep(
    admission: &Admission,
    leases: &Store<FencedLease>,
    writer: &Writer,
    triggers: &Scheduler<LeaseKey>,
) -> Result<()> {
    let served =
        |ns: &str| writer.namespaces.is_empty() || writer.namespaces.iter().any(|n| n == ns);
    let current: Vec<Slot> = (0..shipped::SLOTS).map(|i| stored(admission, i)).collect();
    let plan = slots::plan(&current, &wanted(leases), served);
    admission.lock().unplaced = plan.unplaced.clone();
    let api: Api<ValidatingAdmissionPolicy> = Api::all(writer.client.clone());
    let mut wrote = false;
    for (i, next) in plan.slots.iter().enumerate() {
        let Some(next) = next else { continue }; // not installed
        let name = slot_name(i);
        let Some(cached) = admission.policies.get(&ObjectRef::new(&name)) else {
            continue;
        };
        let desired =
            shipped::slot_policy(i, next.as_ref()).map_err(crate::error::Error::Unexpected)?;
        if shipped::policy_is_current(&cached, &desired) {
            continue;
        }
        let before = match &current[i] {
            Slot::Assigned(a) => Some(a),
            _ => None,
        };
        let added = added(before, next.as_ref());
        // Noted before the write: its watch event may reconcile a lease before this task
        // runs again, and that lease must wait for the apiserver to take the slot in.
        admission.listed(&added);
        // The stored object with the desired spec: its labels and annotations (kubectl's
        // last-applied configuration, say) are someone else's.
        let mut update = (*cached).clone();
        update.spec = desired.spec;
        update.meta_mut().managed_fields = None;
        timed(
            "update kinds slot",
            writer.timeout,
            api.replace(&name, &PostParams::default(), &update),
        )
        .await?;
        admission.listed(&added);
        wrote = true;
        let kind = next.as_ref().map(|a| Kind(&a.kind).to_string());
        let namespaces = next.as_ref().map_or(0, |a| a.namespaces.len());
        info!(slot = %name, ?kind, namespaces, added = added.len(), "kinds slot updated");
    }
    // The leases of what was listed, and those that waited, are reconciled by the slot's
    // watch event, once the cache shows it; those of kinds with no slot here, and those that
    // waited when there was nothing to write (the cache had caught up).
    nudge(admission, leases, triggers, Some(&BTreeSet::new()));
    if wrote {
        return Ok(());
    }
    let pending = std::mem::take(&mut admission.lock().pending);
    for (ns, name) in pending {
        triggers.reconcile(LeaseKey::new(&ns, &name));
    }
    Ok(())
}

/// Slot `i` as the cache has it.
fn stored(admission: &Admission, i: usize) -> Slot {
    match admission.policies.get(&ObjectRef::new(&slot_name(i))) {
        None => Slot::Missing,
        // A match edited by hand is the slot's no more: it is unused (and written so).
        Some(policy) => match shipped::assignment(&policy) {
            Ok(Some(a)) => Slot::Assigned(a),
            Ok(None) | Err(_) => Slot::Unused,
        },
    }
}

/// The kinds the cached leases fence, by namespace.
fn wanted(leases: &Store<FencedLease>) -> Wanted {
    let mut wanted = Wanted::new();
    for lease in leases.state() {
        let Some(ns) = lease.namespace() else {
            continue;
        };
        for kind in lease.spec.fence.iter().flat_map(|f| &f.resources) {
            wanted.entry(kind.clone()).or_default().insert(ns.clone());
        }
    }
    wanted
}

/// The (kind, namespace) pairs `next` lists that `before` did not.
fn added(before: Option<&Assignment>, next: Option<&Assignment>) -> Vec<(FencedResource, String)> {
    let Some(next) = next else { return vec![] };
    next.namespaces
        .iter()
        .filter(|ns| before.is_none_or(|b| b.kind != next.kind || !b.namespaces.contains(*ns)))
        .map(|ns| (next.kind.clone(), ns.clone()))
        .collect()
}

/// Reconciles the leases that fence a kind in a namespace of `touched` (every lease that
/// fences a kind when `None`), and those whose kinds are unplaced.
fn nudge(
    admission: &Admission,
    leases: &Store<FencedLease>,
    triggers: &Scheduler<LeaseKey>,
    touched: Option<&BTreeSet<(FencedResource, String)>>,
) {
    let unplaced = admission.lock().unplaced.clone();
    for lease in leases.state() {
        let Some(ns) = lease.namespace() else {
            continue;
        };
        let concerned = lease.spec.fence.iter().flat_map(|f| &f.resources).any(|k| {
            unplaced.contains(k) || touched.is_none_or(|t| t.contains(&(k.clone(), ns.clone())))
        });
        if concerned {
            triggers.reconcile(LeaseKey::of(&lease));
        }
    }
}
