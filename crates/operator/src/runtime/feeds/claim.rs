//! The claim watch: fills the claim cache and its indexes, keeps the heartbeat clock, and
//! triggers what a claim event asks for. Deletions included: a deleted claim is exactly what
//! must hand a lease over at once.

use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::{Stream, TryStreamExt};
use kube::api::DynamicObject;
use kube::runtime::watcher;

use super::{Memory, Triggers, index_event, is_listed, last_known, own_writes, reconcile, touched};
use crate::context::Kube;
use crate::names::LeaseKey;
use crate::runtime::watch;
use crate::state::cache::{Writer, map_event};
use crate::state::heartbeat::{Heartbeats, beat_of};
use crate::state::own_writes::Trigger;
use crate::state::{CachedClaim, Keyed};
use fenced_lease_api::FencedLeaseClaim;

/// The claim watch of `namespaces` (all when empty), feeding `memory` through `writer`.
pub fn feed<U>(
    kube: &Kube,
    namespaces: &[String],
    unreadable: U,
    memory: &Memory,
    mut writer: Writer<CachedClaim>,
    triggers: &Triggers,
) -> impl Stream<Item = Result<watcher::Event<CachedClaim>, watcher::Error>> + Send + use<U>
where
    U: Fn(&DynamicObject, &serde_json::Error) + Clone + Send + 'static,
{
    let config = watcher::Config::default();
    let (memory, triggers) = (memory.clone(), triggers.clone());
    let (on_error, cached) = (memory.heartbeats.clone(), memory.claims.clone());
    watch::watch::<FencedLeaseClaim>(kube.client.clone(), namespaces, config, unreadable)
        .map_ok(|event| map_event(event, CachedClaim::from))
        .map_ok(move |event| last_known(&cached, event, |c| c.metadata.uid.as_deref()))
        .inspect_ok(move |event| writer.apply(event))
        .inspect_ok(move |event| {
            let changed = observe_heartbeats(&memory.heartbeats, event);
            let state = || memory.claims.state();
            index_event(&memory.claims_by_lease, state, event, |c| {
                vec![c.spec.lease_name.clone()]
            });
            index_event(&memory.claims_by_pod, state, event, |c| {
                c.spec.pod_name.iter().cloned().collect()
            });
            let trigger = send_triggers(&memory, &triggers, event, changed);
            own_writes(
                &memory.written,
                event,
                |c| {
                    (
                        c.metadata.uid.as_deref(),
                        c.metadata.resource_version.as_deref(),
                    )
                },
                trigger,
            );
        })
        // Heartbeats may have been missed: every claim gets a full term, as after a restart.
        .inspect_err(move |_| on_error.restart_all(Instant::now()))
}

/// What a claim event asks for: a sweep after a (re)list (not one trigger per listed claim:
/// thousands at once are what the sweep avoids); the claim reconciler for a claim whose lease
/// the cache lacks (both sent here); its lease's reconcile when something besides its
/// heartbeat changed (returned, to be sent unless the change is the operator's own write).
fn send_triggers(
    memory: &Memory,
    triggers: &Triggers,
    event: &watcher::Event<CachedClaim>,
    changed: bool,
) -> Option<Trigger> {
    if matches!(event, watcher::Event::InitDone) {
        triggers.leases.sweep();
    }
    if let watcher::Event::Apply(claim) | watcher::Event::InitApply(claim) = event
        && lacks_lease(memory, claim)
    {
        let key = (
            Keyed::namespace(claim).to_owned(),
            Keyed::name(claim).to_owned(),
        );
        triggers.claims.reconcile(key);
    }
    // A heartbeat alone only moves the holder's deadline later: the lease's timer already
    // wakes it then, so it costs no reconcile (and no write).
    if !changed || is_listed(event) {
        return None;
    }
    let leases = touched(event)
        .iter()
        .filter_map(|claim| {
            let ns = claim.metadata.namespace.as_deref()?;
            Some(LeaseKey::new(ns, &claim.spec.lease_name))
        })
        .collect();
    reconcile(triggers, leases)
}

/// The claim reconciler acts only on a claim whose lease the cache lacks; the others are not
/// queued for it (each heartbeat is a change, and after a list every claim is one). Until the
/// leases are listed, every claim is queued.
fn lacks_lease(memory: &Memory, claim: &CachedClaim) -> bool {
    !memory.leases_listed.load(Ordering::Acquire)
        || claim.metadata.namespace.as_deref().is_none_or(|ns| {
            let lease = LeaseKey::new(ns, &claim.spec.lease_name);
            memory.leases.get(&lease.object_ref()).is_none()
        })
}

/// Records the heartbeats a claim watch event shows; returns whether it changed anything of a
/// claim besides its heartbeat (a new claim, a deleted one, a status or spec change).
fn observe_heartbeats(heartbeats: &Heartbeats, event: &watcher::Event<CachedClaim>) -> bool {
    let now = Instant::now();
    tracing::trace!(event = ?std::mem::discriminant(event), "claim event");
    match event {
        watcher::Event::Apply(claim) | watcher::Event::InitApply(claim) => {
            match &claim.metadata.uid {
                Some(uid) => {
                    heartbeats.observe(uid, beat_of(&claim.spec), Some(fingerprint(claim)), now)
                }
                None => true,
            }
        }
        // A relist: heartbeats may have been missed while the watch was down.
        watcher::Event::Init => {
            heartbeats.restart_all(now);
            false
        }
        watcher::Event::Delete(claim) => {
            if let Some(uid) = &claim.metadata.uid {
                heartbeats.forget(uid);
            }
            true
        }
        watcher::Event::InitDone => false,
    }
}

/// A hash of everything a lease's decision reads of a claim except its heartbeat.
fn fingerprint(claim: &CachedClaim) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    claim.spec.lease_name.hash(&mut h);
    claim.spec.pod_name.hash(&mut h);
    claim.metadata.deletion_timestamp.is_some().hash(&mut h);
    claim.pod_owner_uid.hash(&mut h);
    claim.status.hash(&mut h);
    h.finish()
}
