//! State shared by the reconcilers and the HTTP server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};

use super::backoff::Failures;
use super::cache::Cache;
use super::cached::CachedClaim;
use super::error::truncate;
use super::events::Events;
use super::heartbeat::Heartbeats;
use super::index::Index;
use super::metrics::Metrics;
use super::pods::CachedPod;
use crate::api::FencedLease;

/// What every reconcile needs.
pub struct Context {
    pub client: Client,
    pub leases: Store<FencedLease>,
    pub claims: Cache<CachedClaim>,
    /// Pods as [`CachedPod`]: existence, UID and token annotations are all the operator reads.
    pub pods: Cache<CachedPod>,
    pub heartbeats: Arc<Heartbeats>,
    /// Events are queued here and published in the background, never awaited.
    pub events: Events,
    pub metrics: Arc<Metrics>,
    /// Namespace of the operator's own state (the token high-water marks).
    pub state_namespace: String,
    /// Deadline of every single API call.
    pub api_timeout: Duration,
    /// All caches have synced: until then no decision is taken (a pod missing from an
    /// unsynced cache is not a deleted pod).
    pub synced: AtomicBool,
    /// Consecutive failed reconciles per lease, for backoff and one Event per cause.
    pub failures: Failures,
    /// Every lease is reconciled at least this often (± a quarter, so that thousands of
    /// leases do not all come due at once), as a safety net.
    pub resync: Duration,
    /// Claims by the lease they ask for.
    pub claims_by_lease: Arc<Index>,
    /// Pods by the leases whose token annotation they carry.
    pub pods_by_lease: Arc<Index>,
    /// Each lease's next reconcile at the latest (its holder's deadline, or the resync).
    pub wakeups: Arc<super::wakeups::Wakeups>,
    /// Versions of leases and claims this operator wrote over that its caches still show.
    pub written: Arc<super::written::Written>,
    /// Leases the sweep, or the pacing of deletions, has queued whose reconcile has not finished.
    pub swept: super::sweep::Swept,
    /// The operator's admission policy bindings (leases with `spec.fenceObjects`).
    pub fence_bindings: super::fence_binding::FenceBindings,
    /// Token records waiting to be written, one write per ConfigMap at a time.
    pub records: super::high_water::Records,
}

/// A reference to claim `name` (uid `uid`) in namespace `ns`.
pub fn claim_reference(ns: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("fencing.dev/v1alpha1".into()),
        kind: Some("FencedLeaseClaim".into()),
        namespace: Some(ns.into()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        ..Default::default()
    }
}

impl Context {
    /// When to look at a lease again when nothing is due: the resync period, jittered.
    pub fn resync_after(&self) -> Duration {
        self.resync.mul_f64(0.75 + 0.5 * rand::random::<f64>())
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Queues an Event for publishing; never waits, and a failure is never fatal.
    pub fn event(
        &self,
        on: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.event_about(on, None, type_, reason, action, note);
    }

    /// Queues an Event about `on` that concerns `related` too (a lease's claim). Events of
    /// the same reason about different claims stay distinct instead of being folded into one
    /// series, so every grant keeps its own note (and token).
    pub fn event_about(
        &self,
        on: &ObjectReference,
        related: Option<ObjectReference>,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate(&note, 1024).to_string()),
            action: action.into(),
            secondary: related,
        };
        self.events.publish(on, event);
    }
}

/// The key a lease is queued and scheduled under: its namespace and name only. Not
/// `ObjectRef::from_obj`, which also copies its UID and resourceVersion, two more strings in
/// each of the controller's 10,000 timers (the key's equality ignores them anyway).
pub fn lease_key(lease: &FencedLease) -> ObjectRef<FencedLease> {
    let key = ObjectRef::new(lease.metadata.name.as_deref().unwrap_or_default());
    match lease.metadata.namespace.as_deref() {
        Some(ns) => key.within(ns),
        None => key,
    }
}

/// A lease's namespace and name as one string, `namespace\0name` (no Kubernetes namespace or
/// name holds a NUL): one allocation a lease where thousands of leases are kept by name.
pub fn joined_name(ns: &str, name: &str) -> String {
    format!("{ns}\0{name}")
}

/// The namespace and name of a [`joined_name`].
pub fn split_name(joined: &str) -> Option<(&str, &str)> {
    joined.split_once('\0')
}
