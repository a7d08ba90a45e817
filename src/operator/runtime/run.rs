//! Wiring: one feed per watch fills the caches and triggers reconciles; the lease controller
//! and the claims of missing leases (each a [`runner`]), the sweep, the wake-up timers and
//! the removal of orphaned annotations act on them. FencedLease is the primary object;
//! claims and pods feed it.
//!
//! The caches are plain, not kube-runtime's shared ones: a shared cache's subscriber that is
//! handed an object already deleted from the cache returns `Pending` without asking to be
//! woken again, and then no longer takes events, and once 1,024 events wait for it the watch
//! itself stops. Controllers here are fed from the watches by channels instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::DynamicObject;
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::feeds::{self, Memory, Receivers, Triggers};
use super::{runner, sweep};
use crate::api::FencedLease;
use crate::operator::admission::{self, Admission};
use crate::operator::context::{Context, Kube};
use crate::operator::error::truncate;
use crate::operator::events::Events;
use crate::operator::metrics::Metrics;
use crate::operator::reconcile::{lease, missing_lease, orphans, positions};

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

/// Leases reconciled at once: bounds the API calls (and connections) in flight, so that an
/// operator started over thousands of waiting claims works through them instead of opening
/// thousands of connections at once.
const LEASE_CONCURRENCY: usize = 32;
/// Of those, at most this many reconcile leases of the sweep that follows every (re)list, or
/// leases being deleted; the others stay free for changes (a new claim is granted at once
/// while thousands are swept, or deleted).
const SWEEP_CONCURRENCY: usize = 24;
/// Claims reconciled at once (only claims of missing leases do any work).
const CLAIM_CONCURRENCY: usize = 8;

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
    // their channels, and the reconcilers start once, on complete caches.
    let synced = tokio::select! {
        () = stop.cancelled() => false,
        synced = mark_synced(&ctx, &memory, &ready) => synced,
    };
    if synced {
        let (to_controller, controller_triggers) = mpsc::unbounded_channel();
        tasks.extend(workers(
            &ctx,
            &memory,
            receivers,
            &triggers,
            to_controller,
            &stop,
        ));
        info!(namespaces = ?settings.namespaces, "controllers started");
        run_lease_controller(ctx, controller_triggers, stop.clone()).await;
    }
    stop.cancel();
    for task in tasks {
        let _ = task.await;
    }
    info!("controllers stopped");
}

/// What acts on the feeds' triggers besides the lease controller, until `stop`.
fn workers(
    ctx: &Arc<Context>,
    memory: &Memory,
    receivers: Receivers,
    triggers: &Triggers,
    to_controller: mpsc::UnboundedSender<ObjectRef<FencedLease>>,
    stop: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    let claim_ctx = ctx.clone();
    let reconcile_claim = move |key| {
        let ctx = claim_ctx.clone();
        async move { missing_lease::reconcile(&ctx, &key).await }
    };
    let wakeups = memory.wakeups.clone();
    let (sweeps, concurrency) = (receivers.sweeps, SWEEP_CONCURRENCY);
    vec![
        tokio::spawn(orphans::sweep(ctx.clone(), receivers.orphans, stop.clone())),
        tokio::spawn(positions::write_due(
            ctx.clone(),
            triggers.leases.clone(),
            stop.clone(),
        )),
        tokio::spawn(wakeups.run(triggers.due.clone(), stop.clone())),
        // Every lease once the caches have synced (one deleted while the operator was down,
        // with no claim to trigger it, say), and after every relist, paced.
        tokio::spawn(sweep::run(
            ctx.clone(),
            concurrency,
            sweeps,
            to_controller.clone(),
            stop.clone(),
        )),
        // Leases being deleted, paced in the sweep's slots: thousands deleted at once must
        // not hold up a change elsewhere.
        tokio::spawn(sweep::route(
            ctx.clone(),
            concurrency,
            (receivers.leases, receivers.due),
            to_controller,
            stop.clone(),
        )),
        // Claims of missing leases.
        tokio::spawn(runner::run(
            CLAIM_CONCURRENCY,
            receivers.claims,
            stop.clone(),
            reconcile_claim,
        )),
    ]
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
        leases: memory.leases.clone(),
        claims: memory.claims.clone(),
        pods: memory.pods.clone(),
        followed: memory.followed.clone(),
        heartbeats: memory.heartbeats.clone(),
        events,
        metrics,
        state_namespace: settings.state_namespace.clone(),
        synced: Default::default(),
        failures: Default::default(),
        resync: settings.resync,
        claims_by_lease: memory.claims_by_lease.clone(),
        pods_by_lease: memory.pods_by_lease.clone(),
        wakeups: memory.wakeups.clone(),
        positions: memory.positions.clone(),
        written: memory.written.clone(),
        swept: Default::default(),
        records: Default::default(),
        records_ahead: Default::default(),
        admission,
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
        ctx.leases.clone(),
        writer,
        again.clone(),
        move || synced.is_synced() && watched.is_ready(),
        stop.clone(),
    );
    let feed = admission::watch::Feed {
        client: client.clone(),
        admission: fence.clone(),
        leases: ctx.leases.clone(),
        triggers: again.clone(),
        stop: stop.clone(),
    };
    vec![
        admission::watch::watch(policies, feed.clone()),
        admission::watch::watch(bindings, feed),
        tokio::spawn(keeper),
    ]
}

/// The lease controller, until `stop`: each triggered lease reconciled as the cache has it
/// then ([`runner`]); a lease the cache no longer has is skipped (the sweep's count of it is
/// pruned, as it is for a lease deleted before its turn).
async fn run_lease_controller(
    ctx: Arc<Context>,
    triggers: mpsc::UnboundedReceiver<ObjectRef<FencedLease>>,
    stop: CancellationToken,
) {
    runner::run(LEASE_CONCURRENCY, triggers, stop, move |key| {
        let ctx = ctx.clone();
        async move {
            let Some(lease) = ctx.leases.get(&key) else {
                tracing::debug!(lease = %key, "no such lease");
                return None;
            };
            let action = match lease::reconcile(lease.clone(), ctx.clone()).await {
                Ok(action) => action,
                // Logged, counted and reported by the error policy.
                Err(error) => lease::error_policy(lease, &error, ctx),
            };
            action.requeue_after()
        }
    })
    .await
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

/// Waits until `store` has synced. Re-polls now and then: the store's readiness signal is
/// shared with the controllers waiting on the same store, and a single wake-up must not be
/// the only way this waiter learns of it.
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
        let event = Event {
            type_: EventType::Warning,
            reason: "UnreadableObject".into(),
            note: Some(truncate(&note, 1024).to_string()),
            action: "Read".into(),
            secondary: None,
        };
        events.publish(&reference, event);
    }
}
