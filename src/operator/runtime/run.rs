//! Wiring: watches (metadata-only for pods, managedFields pruned everywhere), the caches (kube-
//! runtime's store for leases, which its controller needs; compact ones of our own for claims
//! and pods), the lease controller and the runner of claims of missing leases. FencedLease is
//! the primary object; claims and pods feed it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, TryStreamExt, future};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::api::DynamicObject;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, controller, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::cache::{Cache, Keyed, map_event};
use super::cached::CachedClaim;
use super::context::Context;
use super::decode;
use super::error::truncate;
use super::events::Events;
use super::heartbeat::{Heartbeats, beat_of};
use super::index::Index;
use super::metrics::Metrics;
use super::orphans::{self, Orphan};
use super::pods::CachedPod;
use super::sweep;
use super::wakeups::Wakeups;
use super::written::Written;
use super::{claims, reconcile};
use crate::api::{FencedLease, FencedLeaseClaim};

/// Settings of one operator run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Watch one namespace, or all when `None`.
    pub namespace: Option<String>,
    /// Namespace of the operator's own state (the token high-water marks).
    pub state_namespace: String,
    /// Deadline of every API call.
    pub api_timeout: Duration,
    /// Name of this replica in Events (the pod name).
    pub instance: Option<String>,
    /// Reconcile every lease at about this interval too (jittered), as a safety net.
    pub resync: Duration,
}

/// Leases reconciled at once: bounds the API calls (and connections) in flight, so that an
/// operator started over thousands of waiting claims works through them instead of opening
/// thousands of connections at once.
const LEASE_CONCURRENCY: u16 = 32;
/// Of those, at most this many reconcile leases of the sweep that follows every (re)list, or
/// leases being deleted; the others stay free for changes (a new claim is granted at once
/// while thousands are swept, or deleted).
const SWEEP_CONCURRENCY: usize = 24;
/// Claims reconciled at once (only claims of missing leases do any work).
const CLAIM_CONCURRENCY: usize = 8;

fn api<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Memory stays small with many objects: nothing the operator never reads is cached. Its
/// writes never carry these fields back: status writes go to the status subresource (which
/// keeps the rest of the object as stored), the rest are patches of the fields they set.
fn prune<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    meta.labels = None;
    meta.annotations = None;
    meta.generate_name = None;
    meta.self_link = None;
}

fn prune_lease(lease: &mut FencedLease) {
    prune(lease);
    lease.metadata.owner_references = None;
}

/// Leases a pod event concerns: those it carries a token annotation of, and those whose
/// claims name it (found by index, not by a scan of every claim).
fn leases_of_pod(
    pod: &CachedPod,
    claims: &Cache<CachedClaim>,
    claims_by_pod: &Index,
) -> Vec<ObjectRef<FencedLease>> {
    let (ns, name) = (pod.namespace.as_str(), pod.name.as_str());
    let annotated = pod
        .leases()
        .into_iter()
        .map(|lease| ObjectRef::new(&lease).within(ns));
    let claimed = claims_by_pod
        .get(ns, name)
        .into_iter()
        .filter_map(|claim| claims.get(ns, &claim))
        .filter(|c| c.spec.pod_name.as_deref() == Some(name))
        .map(|c| ObjectRef::new(&c.spec.lease_name).within(ns));
    annotated.chain(claimed).collect()
}

/// Keeps `index` in step with a watch of objects keyed by `keys`: set on apply, removed on
/// delete, rebuilt from `store` when a relist completes.
fn index_event<K: Keyed + Clone>(
    index: &Index,
    store: &Cache<K>,
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
        watcher::Event::InitDone => index.rebuild(store.state().iter().map(|o| {
            let (ns, name) = id(o);
            (ns, name, keys(o.as_ref()))
        })),
        watcher::Event::Init => {}
    }
}

/// A watch event shows the cache past the operator's own write of an object: its record goes.
/// `version` gives an object's UID and resourceVersion.
fn caught_up<K>(
    written: &Written,
    event: &watcher::Event<K>,
    version: impl Fn(&K) -> (Option<&str>, Option<&str>),
) {
    if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = event {
        let (uid, resource_version) = version(o);
        written.seen(uid, resource_version);
    }
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

/// Runs the operator until `stop` is cancelled; sets `ready` once the caches have synced.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    ready: Arc<std::sync::atomic::AtomicBool>,
    stop: CancellationToken,
) {
    let wc = watcher::Config::default();
    let ns = &settings.namespace;
    let reporter = Reporter {
        controller: "fenced-lease-operator".into(),
        instance: settings.instance.clone(),
    };
    let events = Events::start(
        client.clone(),
        reporter,
        metrics.clone(),
        settings.api_timeout,
        stop.clone(),
    );
    let unreadable = report_unreadable(events.clone(), metrics.clone());

    // Plain caches, not kube-runtime's shared ones: a shared cache's subscriber that is handed
    // an object already deleted from the cache returns `Pending` without asking to be woken
    // again, and then no longer takes events; once 1,024 wait for it, the watch itself stops,
    // and with it every trigger that would have woken it. Deleting 3,000 leases at once
    // wedged the operator for good (the apiserver closed the stalled watch as
    // unresponsive, unheard). Controllers here are fed from the watches by channels instead.
    let (lease_store, lease_writer) = reflector::store::<FencedLease>();
    metrics.leases.watch(lease_store.clone());
    // Every trigger of a lease reconcile goes through this channel: lease changes, claim and
    // pod events, and wake-ups. Those of leases being deleted are paced (`sweep::route`).
    let (lease_triggers, lease_trigger_events) =
        tokio::sync::mpsc::unbounded_channel::<ObjectRef<FencedLease>>();
    // The controller's: routed triggers, and the paced sweep of every lease after a (re)list.
    let (controller_triggers, controller_trigger_events) =
        tokio::sync::mpsc::unbounded_channel::<ObjectRef<FencedLease>>();
    let (sweep_requests, sweep_request_events) = tokio::sync::mpsc::channel::<()>(1);
    let (orphan_tx, orphan_rx) = tokio::sync::mpsc::unbounded_channel::<Orphan>();
    // Not shared: no controller subscribes to pods; their events become lease triggers here.
    let (pod_store, mut pod_writer) = Cache::<CachedPod>::new();
    let pods_by_lease = Arc::new(Index::default());
    let written = Arc::new(Written::default());
    let wakeups = Arc::new(Wakeups::default());
    let gone_leases = {
        let (pods, orphan_tx, metrics, written, wakeups) = (
            pods_by_lease.clone(),
            orphan_tx.clone(),
            metrics.clone(),
            written.clone(),
            wakeups.clone(),
        );
        move |event: &watcher::Event<FencedLease>| {
            caught_up(&written, event, |l| {
                (
                    l.metadata.uid.as_deref(),
                    l.metadata.resource_version.as_deref(),
                )
            });
            if let watcher::Event::Delete(lease) = event {
                if let Some(uid) = &lease.metadata.uid {
                    written.forget(uid);
                }
                let (ns, name) = (lease.namespace().unwrap_or_default(), lease.name_any());
                metrics.forget_lease(&ns, &name);
                wakeups.forget(&ns, &name);
                for pod in annotated_pods(&pods, &ns, &name) {
                    let _ = orphan_tx.send(Orphan {
                        namespace: ns.clone(),
                        pod,
                        lease: name.clone(),
                    });
                }
            }
        }
    };
    // Set once the leases have been listed (the lease cache is ready).
    let leases_listed = Arc::new(AtomicBool::new(false));
    let leases =
        decode::watch::<FencedLease>(client.clone(), ns.clone(), wc.clone(), unreadable.clone())
            .modify(prune_lease)
            .reflect(lease_writer)
            .inspect_ok(gone_leases)
            .inspect_ok({
                let (triggers, sweeps) = (lease_triggers.clone(), sweep_requests.clone());
                let listed = leases_listed.clone();
                move |event| match event {
                    // A change: reconcile that lease now.
                    watcher::Event::Apply(lease) => {
                        let _ = triggers.send(super::context::lease_key(lease));
                    }
                    // A (re)list: every lease, paced by the sweep (one sweep pending is enough).
                    watcher::Event::InitDone => {
                        listed.store(true, Ordering::Release);
                        let _ = sweeps.try_send(());
                    }
                    _ => {}
                }
            });

    // Claim and pod events, deletions included: a deleted claim or pod is exactly what must
    // hand a lease over at once.
    let heartbeats = Arc::new(Heartbeats::default());
    // Claims as `CachedClaim`s: what decisions read, compacted (see `cached`).
    let (claim_store, mut claim_writer) = Cache::<CachedClaim>::new();
    // The claim reconciler acts only on a claim whose lease the cache lacks; the others are
    // not queued for it (each heartbeat is a change, and after a list every claim is one:
    // 10,000 of them queued at once held ~6 MiB of scheduler slots after a start over 10,000
    // leases). Until the leases are listed, every claim is queued.
    let (claim_triggers, claim_trigger_events) =
        tokio::sync::mpsc::unbounded_channel::<claims::ClaimKey>();
    let lacks_lease = {
        let (leases, listed) = (lease_store.clone(), leases_listed.clone());
        move |claim: &CachedClaim| {
            !listed.load(Ordering::Acquire)
                || claim.metadata.namespace.as_deref().is_none_or(|ns| {
                    let lease = ObjectRef::<FencedLease>::new(&claim.spec.lease_name).within(ns);
                    leases.get(&lease).is_none()
                })
        }
    };
    let observer = heartbeats.clone();
    let on_error = heartbeats.clone();
    let claims_by_lease = Arc::new(Index::default());
    let claims_by_pod = Arc::new(Index::default());
    let claims_stream =
        decode::watch::<FencedLeaseClaim>(client.clone(), ns.clone(), wc.clone(), unreadable)
            .map_ok(|event| map_event(event, CachedClaim::from))
            .inspect_ok(move |event| claim_writer.apply(event))
            .inspect_ok({
                let lease_triggers = lease_triggers.clone();
                let claim_sweeps = sweep_requests.clone();
                let (by_lease, by_pod) = (claims_by_lease.clone(), claims_by_pod.clone());
                let store = claim_store.clone();
                let written = written.clone();
                let claim_triggers = claim_triggers.clone();
                move |event| {
                    let changed = observe_heartbeats(&observer, event);
                    caught_up(&written, event, |c| {
                        (
                            c.metadata.uid.as_deref(),
                            c.metadata.resource_version.as_deref(),
                        )
                    });
                    if let watcher::Event::Delete(claim) = event
                        && let Some(uid) = &claim.metadata.uid
                    {
                        written.forget(uid);
                    }
                    index_event(&by_lease, &store, event, |c| {
                        vec![c.spec.lease_name.clone()]
                    });
                    index_event(&by_pod, &store, event, |c| {
                        c.spec.pod_name.iter().cloned().collect()
                    });
                    // A (re)list: every lease, paced, once it is done (not one trigger per
                    // listed claim: thousands at once are what the sweep avoids).
                    if matches!(event, watcher::Event::InitDone) {
                        let _ = claim_sweeps.try_send(());
                    }
                    if let watcher::Event::Apply(claim) | watcher::Event::InitApply(claim) = event
                        && lacks_lease(claim)
                    {
                        let key = (
                            Keyed::namespace(claim).to_owned(),
                            Keyed::name(claim).to_owned(),
                        );
                        let _ = claim_triggers.send(key);
                    }
                    for claim in touched(event) {
                        // A heartbeat alone only moves the holder's deadline later: the lease's
                        // timer already wakes it then, so it costs no reconcile (and no write).
                        if !changed || is_listed(event) {
                            continue;
                        }
                        if let Some(ns) = claim.metadata.namespace.as_deref() {
                            let _ = lease_triggers
                                .send(ObjectRef::new(&claim.spec.lease_name).within(ns));
                        }
                    }
                }
            })
            // Heartbeats may have been missed: every claim gets a full term, as after a restart.
            .inspect_err(move |_| on_error.restart_all(Instant::now()));

    let pod_sweeps = sweep_requests.clone();
    let binding_triggers = lease_triggers.clone();
    let lease_triggers_for_wakeups = lease_triggers.clone();
    let claims_for_pods = claim_store.clone();
    let leases_for_pods = lease_store.clone();
    let pod_writes = written.clone();
    let (by_pod, by_annotation, pod_cache) = (
        claims_by_pod.clone(),
        pods_by_lease.clone(),
        pod_store.clone(),
    );
    let pod_watch = watcher(api::<PartialObjectMeta<Pod>>(&client, ns), wc)
        .default_backoff()
        .map_ok(|event| map_event(event, CachedPod::from_meta));
    let pods = pod_watch
        .inspect_ok(move |event| pod_writer.apply(event))
        .inspect_ok(move |event| {
            caught_up(&pod_writes, event, |p| {
                (p.uid.as_deref(), p.resource_version.as_deref())
            });
            if let watcher::Event::Delete(pod) = event
                && let Some(uid) = &pod.uid
            {
                pod_writes.forget(uid);
            }
            index_event(&by_annotation, &pod_cache, event, CachedPod::leases);
            if matches!(event, watcher::Event::InitDone) {
                let _ = pod_sweeps.try_send(());
            }
            for pod in touched(event) {
                for lease in leases_of_pod(pod, &claims_for_pods, &by_pod) {
                    if leases_for_pods.get(&lease).is_none() && pod.token(&lease.name).is_some() {
                        let _ = orphan_tx.send(Orphan {
                            namespace: lease.namespace.clone().unwrap_or_default(),
                            pod: pod.name.clone(),
                            lease: lease.name.clone(),
                        });
                    }
                    if !is_listed(event) {
                        let _ = lease_triggers.send(lease);
                    }
                }
            }
        });

    let ctx = Arc::new(Context {
        client: client.clone(),
        leases: lease_store.clone(),
        claims: claim_store.clone(),
        pods: pod_store.clone(),
        heartbeats,
        events,
        metrics,
        api_timeout: settings.api_timeout,
        state_namespace: settings.state_namespace.clone(),
        synced: Default::default(),
        failures: Default::default(),
        resync: settings.resync,
        claims_by_lease,
        pods_by_lease: pods_by_lease.clone(),
        wakeups: wakeups.clone(),
        written,
        swept: Default::default(),
        records: Default::default(),
        fence_bindings: super::fence_binding::FenceBindings::start(
            client.clone(),
            ns.clone(),
            settings.api_timeout,
            binding_triggers,
            stop.clone(),
        ),
    });

    let watches = [
        drive("fencedleases", leases, stop.clone()),
        drive("fencedleaseclaims", claims_stream, stop.clone()),
        drive("pods", pods, stop.clone()),
        tokio::spawn(orphans::sweep(ctx.clone(), orphan_rx, stop.clone())),
        tokio::spawn(wakeups.run(lease_triggers_for_wakeups, stop.clone())),
    ];

    let sync_ctx = ctx.clone();
    let (ls, cs, ps) = (lease_store.clone(), claim_store.clone(), pod_store.clone());
    tokio::spawn(async move {
        let started = Instant::now();
        let (l, c, p) = futures::join!(wait_synced(&ls), cs.ready(), ps.ready());
        match (l, c, p) {
            (Ok(()), Ok(()), Ok(())) => {
                sync_ctx.synced.store(true, Ordering::Release);
                ready.store(true, Ordering::Release);
                let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                info!(
                    leases = ls.len(),
                    claims = cs.len(),
                    pods = ps.len(),
                    elapsed_ms,
                    "caches synced"
                );
            }
            (l, c, p) => {
                warn!(leases = ?l.err(), claims = ?c.err(), pods = ?p.err(), "caches stopped before they synced")
            }
        }
    });

    // Every lease once the caches have synced (one being deleted while the operator was
    // down, with no claim to trigger it, say), paced; after that each lease requeues itself.
    let sweeping = tokio::spawn(sweep::run(
        ctx.clone(),
        SWEEP_CONCURRENCY,
        sweep_request_events,
        controller_triggers.clone(),
        stop.clone(),
    ));
    // Leases being deleted, paced in the sweep's slots: a namespace of thousands deleted at
    // once must not hold up a change elsewhere.
    let routing = tokio::spawn(sweep::route(
        ctx.clone(),
        SWEEP_CONCURRENCY,
        lease_trigger_events,
        controller_triggers,
        stop.clone(),
    ));
    // Leases are reconciled only when triggered (a list would hand out every lease at once).
    let lease_controller = Controller::for_stream(futures::stream::pending(), lease_store)
        .with_config(controller::Config::default().concurrency(LEASE_CONCURRENCY))
        .reconcile_on(tokio_stream_from(controller_trigger_events))
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconcile::reconcile, reconcile::error_policy, ctx.clone())
        .for_each(|result| {
            match result {
                // A claim names a lease that does not exist: the claim runner reports it.
                Err(kube::runtime::controller::Error::ObjectNotFound(obj)) => {
                    tracing::debug!(lease = %obj, "no such lease")
                }
                // Logged, counted and reported by the error policy already.
                Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
                Err(e) => warn!(error = %e, "lease controller"),
                Ok(_) => {}
            }
            future::ready(())
        });

    // Claims of missing leases: not kube-runtime's controller, which needs the full API type.
    let claim_runner = tokio::spawn(claims::run(
        ctx.clone(),
        CLAIM_CONCURRENCY,
        claim_trigger_events,
        claim_triggers,
        stop.clone(),
    ));

    info!(namespace = ?settings.namespace, "controllers started");
    lease_controller.await;
    stop.cancel();
    let _ = claim_runner.await;
    for watch in watches {
        let _ = watch.await;
    }
    let _ = sweeping.await;
    let _ = routing.await;
    info!("controllers stopped");
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
        let event = Event {
            type_: EventType::Warning,
            reason: "UnreadableObject".into(),
            note: Some(
                truncate(
                    &format!(
                        "fenced-lease-operator cannot read this object and ignores it: {error}"
                    ),
                    1024,
                )
                .to_string(),
            ),
            action: "Read".into(),
            secondary: None,
        };
        events.publish(&reference, event);
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

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
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
                    heartbeats.observe_claim(uid, beat_of(&claim.spec), fingerprint(claim), now)
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

/// Pods of namespace `ns` carrying the token annotation of lease `lease`, by index.
fn annotated_pods(pods_by_lease: &Index, ns: &str, lease: &str) -> Vec<String> {
    pods_by_lease.get(ns, lease)
}
