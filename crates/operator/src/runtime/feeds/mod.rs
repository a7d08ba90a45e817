//! One feed per watch (leases, claims, pods, and the coordination Leases leases follow). A feed keeps its caches and indexes in step with
//! its watch, and sends on [`Triggers`] what each event asks for: a lease to reconcile, a
//! sweep of every lease after a (re)list, a claim of a missing lease, an orphaned annotation.

pub mod claim;
pub mod followed;
pub mod lease;
pub mod pod;

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::api::DynamicObject;
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::context::Kube;
use crate::metrics::Metrics;
use crate::names::LeaseKey;
use crate::reconcile::missing_lease::ClaimKey;
use crate::reconcile::orphans::Orphan;
use crate::scheduler::{Commands, Scheduler};
use crate::state::own_writes::{Trigger, fire};
use crate::state::{Cache, Index, Keyed, Memory, OwnWrites, Writers};

/// Where feeds send what their events ask for (cheap to clone).
#[derive(Clone)]
pub struct Triggers {
    /// Leases to reconcile (a change; after a (re)list, every lease).
    pub leases: Scheduler<LeaseKey>,
    /// Claims whose lease the cache lacks.
    pub claims: Scheduler<ClaimKey>,
    /// Token annotations of leases that are gone.
    pub orphans: mpsc::UnboundedSender<Orphan>,
}

/// The receiving ends of [`Triggers`].
pub struct Receivers {
    pub leases: Commands<LeaseKey>,
    pub claims: Commands<ClaimKey>,
    pub orphans: mpsc::UnboundedReceiver<Orphan>,
}

pub fn triggers() -> (Triggers, Receivers) {
    let (leases, lease_commands) = Scheduler::new();
    let (claims, claim_commands) = Scheduler::new();
    let (orphans, orphan_rx) = mpsc::unbounded_channel();
    let triggers = Triggers {
        leases,
        claims,
        orphans,
    };
    let receivers = Receivers {
        leases: lease_commands,
        claims: claim_commands,
        orphans: orphan_rx,
    };
    (triggers, receivers)
}

/// Starts the four feeds of `namespaces` (all when empty), until `stop`.
#[allow(clippy::too_many_arguments)]
pub fn start<U>(
    kube: &Kube,
    namespaces: &[String],
    unreadable: U,
    memory: &Memory,
    writers: Writers,
    triggers: &Triggers,
    metrics: Arc<Metrics>,
    stop: &CancellationToken,
) -> Vec<JoinHandle<()>>
where
    U: Fn(&DynamicObject, &serde_json::Error) + Clone + Send + 'static,
{
    let (ns, leases_writer) = (namespaces, writers.leases);
    let leases = lease::feed(
        kube,
        ns,
        unreadable.clone(),
        memory,
        leases_writer,
        triggers,
        metrics,
    );
    let claims = claim::feed(kube, ns, unreadable, memory, writers.claims, triggers);
    let pods = pod::feed(kube, ns, memory, writers.pods, triggers);
    let followed = followed::feed(kube, ns, memory, writers.followed, triggers);
    vec![
        drive("fencedleases", leases, stop.clone()),
        drive("fencedleaseclaims", claims, stop.clone()),
        drive("pods", pods, stop.clone()),
        drive("leases.coordination.k8s.io", followed, stop.clone()),
    ]
}

/// Drives a watch stream (which fills its cache) until `stop`.
fn drive<S, T>(
    what: &'static str,
    stream: S,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()>
where
    S: Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    T: Send + 'static,
{
    tokio::spawn(async move {
        let stream = stream.take_until(stop.cancelled_owned());
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                warn!(watch = what, error = %e, "watch failed; retrying with backoff");
            }
        }
    })
}

/// Keeps `index` in step with a watch of objects keyed by `keys`: set on apply, removed on
/// delete, rebuilt from every object cached (`state`) when a relist completes.
fn index_event<K: Keyed>(
    index: &Index,
    state: impl FnOnce() -> Vec<Arc<K>>,
    event: &watcher::Event<K>,
    keys: impl Fn(&K) -> Vec<String>,
) {
    let id = |o: &K| (o.namespace().to_owned(), o.name().to_owned());
    match event {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
            let (ns, name) = id(o);
            index.set(&ns, &name, keys(o));
        }
        watcher::Event::Delete(o) => {
            let (ns, name) = id(o);
            index.remove(&ns, &name)
        }
        watcher::Event::InitDone => index.rebuild(state().iter().map(|o| {
            let (ns, name) = id(o);
            (ns, name, keys(o.as_ref()))
        })),
        watcher::Event::Init => {}
    }
}

/// Keeps the marks of the operator's own writes in step with a watch, and sends what the
/// event asks for (`trigger`) unless it shows only a write of this operator that no reconcile
/// waits for (see [`OwnWrites::seen`]). A watch event showing the cache past a write removes
/// its mark, and a deleted object's marks go. `version` gives an object's UID and
/// resourceVersion. Call once the caches and indexes have the event.
fn own_writes<K>(
    written: &OwnWrites,
    event: &watcher::Event<K>,
    version: impl Fn(&K) -> (Option<&str>, Option<&str>),
    trigger: Option<Trigger>,
) {
    match event {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
            let (uid, resource_version) = version(o);
            return written.seen(uid, resource_version, trigger);
        }
        watcher::Event::Delete(o) => {
            if let (Some(uid), _) = version(o) {
                written.forget(uid);
            }
        }
        watcher::Event::Init | watcher::Event::InitDone => {}
    }
    fire(trigger);
}

/// A trigger that reconciles `leases`.
fn reconcile(triggers: &Triggers, leases: Vec<LeaseKey>) -> Option<Trigger> {
    if leases.is_empty() {
        return None;
    }
    let scheduler = triggers.leases.clone();
    Some(Box::new(move || {
        for lease in leases {
            scheduler.reconcile(lease);
        }
    }))
}

/// A deletion with the cache's copy of the object in it when the copy is of the same object
/// (same UID). A deletion that a merged watch inferred from a relist names the object only
/// ([`crate::runtime::merge`]); what it triggers (a claim's lease, a pod's leases)
/// is read from the copy. Call before the cache applies the event.
fn last_known<K: Keyed + Clone>(
    cache: &Cache<K>,
    event: watcher::Event<K>,
    uid: impl Fn(&K) -> Option<&str>,
) -> watcher::Event<K> {
    match event {
        watcher::Event::Delete(o) => match cache.get(o.namespace(), o.name()) {
            Some(copy) if uid(&copy) == uid(&o) => watcher::Event::Delete((*copy).clone()),
            _ => watcher::Event::Delete(o),
        },
        other => other,
    }
}

/// Is this an object of a (re)list? Those are reconciled by the sweep once the list is done.
fn is_listed<K>(event: &watcher::Event<K>) -> bool {
    matches!(event, watcher::Event::InitApply(_))
}

/// The objects a watch event adds, changes or removes.
fn touched<K>(event: &watcher::Event<K>) -> &[K] {
    match event {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) | watcher::Event::Delete(o) => {
            std::slice::from_ref(o)
        }
        watcher::Event::Init | watcher::Event::InitDone => &[],
    }
}
