//! Wiring: one feed per watch fills the caches and triggers reconciles; the scheduler of the
//! leases and that of the claims of missing leases ([`scheduler`]), the position writer and
//! the removal of orphaned annotations act on them. FencedLease is the primary object;
//! claims and pods feed it.
//!
//! The caches are plain, not kube-runtime's shared ones: a shared cache's subscriber that is
//! handed an object already deleted from the cache returns `Pending` without asking to be
//! woken again, and then no longer takes events, and once 1,024 events wait for it the watch
//! itself stops. Controllers here are fed from the watches by channels instead.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::DynamicObject;
use kube::runtime::events::{EventType, Reporter};
use kube::runtime::reflector::{self, Store};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::feeds::{self, Receivers, Triggers};
use crate::admission::{self, Admission};
use crate::context::{Context, Kube};
use crate::events::Events;
use crate::metrics::Metrics;
use crate::names::LeaseKey;
use crate::reconcile::missing_lease::ClaimKey;
use crate::reconcile::{lease, missing_lease, orphans, positions};
use crate::scheduler::{self, Config, Work};
use crate::state::Memory;

/// Settings of one operator run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Watch these namespaces, or all when empty.
    pub namespaces: Vec<String>,
    /// Namespace of the operator's own state (the token records).
    pub state_namespace: String,
    /// Deadline of every API call.
    pub api_timeout: Duration,
    /// Name of this replica in Events (the pod name).
    pub instance: Option<String>,
    /// Reconcile every lease at about this interval too (jittered), as a safety net.
    pub resync: Duration,
    /// Normal Events (grants, releases) published per second at most, after a burst.
    pub events_per_second: f64,
}

/// Runs the operator until `stop` is cancelled; sets `ready` once the caches have synced.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let timeout = settings.api_timeout;
    let (kube, ns) = (Kube { client, timeout }, &settings.namespaces);
    let events = start_events(&kube, &settings, &metrics, &stop);
    let unreadable = report_unreadable(events.clone(), metrics.clone());
    let (triggers, receivers) = feeds::triggers();
    let (memory, writers) = Memory::new();
    metrics
        .leases
        .watch(memory.leases.clone(), memory.claims.clone());
    let (policies, policy_writer) = reflector::store();
    let (bindings, binding_writer) = reflector::store();
    let fence = Admission::new(policies, bindings);
    let ctx = context(&kube, &settings, &memory, events, metrics.clone(), fence);
    let mut tasks = feeds::start(
        &kube, ns, unreadable, &memory, writers, &triggers, metrics, &stop,
    );
    tasks.extend(admission_tasks(
        &ctx,
        &settings,
        policy_writer,
        binding_writer,
        &triggers,
        &stop,
    ));
    // No decision before every cache has synced: what the feeds trigger meanwhile waits in
    // the schedulers, which start once, on complete caches.
    let (gate, opened) = tokio::sync::watch::channel(false);
    tasks.extend(workers(&ctx, receivers, &triggers, opened, &stop));
    let synced = tokio::select! {
        () = stop.cancelled() => false,
        synced = mark_synced(&ctx, &memory, &ready) => synced,
    };
    if synced {
        let _ = gate.send(true);
        info!(namespaces = ?settings.namespaces, "controllers started");
        stop.cancelled().await;
    }
    stop.cancel();
    for task in tasks {
        let _ = task.await;
    }
    info!("controllers stopped");
}

/// What acts on the feeds' triggers, until `stop`: the two schedulers, once `opened` says
/// every cache has synced, the position writer and the removal of orphaned annotations.
fn workers(
    ctx: &Arc<Context>,
    receivers: Receivers,
    triggers: &Triggers,
    opened: tokio::sync::watch::Receiver<bool>,
    stop: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    let gate = move || {
        let mut opened = opened.clone();
        async move { opened.wait_for(|open| *open).await.is_ok() }
    };
    let leases = scheduler::run(
        Config::LEASES,
        receivers.leases,
        gate(),
        Leases(ctx.clone()),
        stop.clone(),
    );
    let claims = scheduler::run(
        Config::CLAIMS,
        receivers.claims,
        gate(),
        MissingLeases(ctx.clone()),
        stop.clone(),
    );
    let writer = positions::write_due(ctx.clone(), triggers.leases.clone(), stop.clone());
    vec![
        tokio::spawn(leases),
        tokio::spawn(claims),
        tokio::spawn(writer),
        tokio::spawn(orphans::sweep(ctx.clone(), receivers.orphans, stop.clone())),
    ]
}

/// The leases, each reconciled as the cache has it then (one it no longer has is skipped);
/// every lease after a (re)list (one deleted while the operator was down, with no claim to
/// trigger it, say), and every lease being deleted, as bulk work: thousands deleted at once
/// must not hold up a change elsewhere.
struct Leases(Arc<Context>);

impl Work<LeaseKey> for Leases {
    fn all(&self) -> Vec<LeaseKey> {
        let leases = self.0.memory.leases.state();
        leases.iter().map(|l| LeaseKey::of(l)).collect()
    }

    fn is_bulk(&self, key: &LeaseKey) -> bool {
        let lease = self.0.memory.leases.get(&key.object_ref());
        lease.is_some_and(|l| l.metadata.deletion_timestamp.is_some())
    }

    fn reconcile(&self, key: LeaseKey) -> impl Future<Output = Option<Duration>> + Send + 'static {
        let ctx = self.0.clone();
        async move {
            let Some(lease) = ctx.memory.leases.get(&key.object_ref()) else {
                tracing::debug!(lease = %key, "no such lease");
                return None;
            };
            match lease::reconcile(lease.clone(), ctx.clone()).await {
                Ok(again) => again,
                // Logged, counted and reported by the error policy.
                Err(error) => lease::error_policy(lease, &error, ctx),
            }
        }
    }
}

/// The claims whose lease the cache lacks (sent by the claim feed; no sweep).
struct MissingLeases(Arc<Context>);

impl Work<ClaimKey> for MissingLeases {
    fn all(&self) -> Vec<ClaimKey> {
        vec![]
    }

    fn is_bulk(&self, _: &ClaimKey) -> bool {
        false
    }

    fn reconcile(&self, key: ClaimKey) -> impl Future<Output = Option<Duration>> + Send + 'static {
        let ctx = self.0.clone();
        async move { missing_lease::reconcile(&ctx, &key).await }
    }
}

fn start_events(
    kube: &Kube,
    settings: &Settings,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
) -> Events {
    let reporter = Reporter {
        controller: "fenced-lease-operator".into(),
        instance: settings.instance.clone(),
    };
    Events::start(
        kube.client.clone(),
        reporter,
        metrics.clone(),
        kube.timeout,
        settings.events_per_second,
        stop.clone(),
    )
}

fn context(
    kube: &Kube,
    settings: &Settings,
    memory: &Memory,
    events: Events,
    metrics: Arc<Metrics>,
    admission: Admission,
) -> Arc<Context> {
    Arc::new(Context {
        kube: kube.clone(),
        memory: memory.clone(),
        events,
        metrics,
        admission,
        failures: Default::default(),
        records: Default::default(),
        records_ahead: Default::default(),
        state_namespace: settings.state_namespace.clone(),
        resync: settings.resync,
        synced: Default::default(),
    })
}

/// The watches of the admission objects, and the keeper of the kinds slots.
fn admission_tasks(
    ctx: &Arc<Context>,
    settings: &Settings,
    policies: reflector::store::Writer<ValidatingAdmissionPolicy>,
    bindings: reflector::store::Writer<ValidatingAdmissionPolicyBinding>,
    triggers: &Triggers,
    stop: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    let (client, fence) = (&ctx.kube.client, &ctx.admission);
    let again = triggers.leases.clone();
    let writer = admission::sync::Writer {
        client: client.clone(),
        timeout: ctx.kube.timeout,
        namespaces: settings.namespaces.clone(),
    };
    let (synced, watched) = (ctx.clone(), fence.clone());
    let keeper = admission::sync::run(
        fence.clone(),
        ctx.memory.leases.clone(),
        writer,
        again.clone(),
        move || synced.is_synced() && watched.is_ready(),
        stop.clone(),
    );
    let feed = admission::watch::Feed {
        client: client.clone(),
        admission: fence.clone(),
        leases: ctx.memory.leases.clone(),
        triggers: again.clone(),
        stop: stop.clone(),
    };
    vec![
        admission::watch::watch(policies, feed.clone()),
        admission::watch::watch(bindings, feed),
        tokio::spawn(keeper),
    ]
}

/// Waits until every cache has synced, then marks the operator synced (and ready); false if
/// a cache stopped first.
async fn mark_synced(ctx: &Context, memory: &Memory, ready: &AtomicBool) -> bool {
    let started = Instant::now();
    // Not the coordination Leases': a following lease reads its Lease from the API before its
    // holder changes, so an unsynced cache costs a read, and a Lease watch the operator may
    // not make (RBAC not upgraded) stops only the leases that follow one.
    let (leases, claims, pods) = (&memory.leases, &memory.claims, &memory.pods);
    match futures::join!(wait_synced(leases), claims.ready(), pods.ready()) {
        (Ok(()), Ok(()), Ok(())) => {
            ctx.synced.store(true, Ordering::Release);
            ready.store(true, Ordering::Release);
            let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let (leases, claims, pods) = (leases.len(), claims.len(), pods.len());
            info!(leases, claims, pods, elapsed_ms, "caches synced");
            true
        }
        (l, c, p) => {
            warn!(leases = ?l.err(), claims = ?c.err(), pods = ?p.err(), "caches stopped before they synced");
            false
        }
    }
}

/// Waits until `store` has synced. Re-polls now and then: the store's readiness is a one-shot
/// behind a lock whose waker another poller can replace, so one wake-up must not be the only
/// way this waiter learns of it.
async fn wait_synced<K>(store: &Store<K>) -> Result<(), reflector::store::WriterDropped>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        if let Ok(result) =
            tokio::time::timeout(Duration::from_millis(100), store.wait_until_ready()).await
        {
            return result;
        }
    }
}

/// Reports an object the operator cannot read: a warning log, a metric, and a Warning Event
/// on the object, so its owner learns why it is ignored.
fn report_unreadable(
    events: Events,
    metrics: Arc<Metrics>,
) -> impl Fn(&DynamicObject, &serde_json::Error) + Clone + Send + Sync + 'static {
    move |object, error| {
        let kind = object
            .types
            .as_ref()
            .map(|t| t.kind.clone())
            .unwrap_or_default();
        warn!(kind = %kind, name = ?object.metadata.name, namespace = ?object.metadata.namespace, %error, "cannot read object; ignoring it");
        metrics.error("unreadable");
        let reference = ObjectReference {
            api_version: object.types.as_ref().map(|t| t.api_version.clone()),
            kind: Some(kind),
            name: object.metadata.name.clone(),
            namespace: object.metadata.namespace.clone(),
            uid: object.metadata.uid.clone(),
            ..Default::default()
        };
        let note = format!("fenced-lease-operator cannot read this object and ignores it: {error}");
        events.event(
            &reference,
            EventType::Warning,
            "UnreadableObject",
            "Read",
            note,
        );
    }
}
