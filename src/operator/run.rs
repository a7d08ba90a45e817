//! Wiring: watches (metadata-only for pods, managedFields pruned everywhere), shared caches,
//! and the two controllers. FencedLease is the primary object; claims and pods feed it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, TryStreamExt, future};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::api::DynamicObject;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::context::Context;
use super::decode;
use super::error::truncate;
use super::heartbeat::Heartbeats;
use super::metrics::Metrics;
use super::{claims, reconcile};
use crate::api::{FencedLease, FencedLeaseClaim, TOKEN_ANNOTATION_PREFIX};

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
    /// Reconcile every lease at this interval too, as a safety net.
    pub resync: Duration,
}

/// Buffer of each shared cache's fan-out to the controllers.
const SHARED_BUFFER: usize = 1024;

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

/// Memory stays small with many objects: nothing the operator never reads is cached.
fn prune<K: Resource>(object: &mut K) {
    object.managed_fields_mut().clear();
    object
        .annotations_mut()
        .remove("kubectl.kubernetes.io/last-applied-configuration");
}

/// Leases a pod event concerns: those it carries a token annotation of, and those whose
/// claims name it.
fn leases_of_pod(
    pod: &PartialObjectMeta<Pod>,
    claims: &Store<FencedLeaseClaim>,
) -> Vec<ObjectRef<FencedLease>> {
    let (Some(ns), Some(name)) = (
        pod.metadata.namespace.as_deref(),
        pod.metadata.name.as_deref(),
    ) else {
        return vec![];
    };
    let annotated = pod
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter_map(|(key, _)| key.strip_prefix(TOKEN_ANNOTATION_PREFIX)?.strip_prefix('/'))
        .map(|lease| ObjectRef::new(lease).within(ns));
    let claimed = claims
        .state_filter(|c| {
            c.metadata.namespace.as_deref() == Some(ns) && c.spec.pod_name.as_deref() == Some(name)
        })
        .into_iter()
        .map(|c| ObjectRef::new(&c.spec.lease_name).within(ns));
    annotated.chain(claimed).collect()
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
    let recorder = Recorder::new(client.clone(), reporter);
    let unreadable = report_unreadable(recorder.clone(), metrics.clone(), settings.api_timeout);

    let (lease_store, lease_writer) = reflector::store_shared::<FencedLease>(SHARED_BUFFER);
    let lease_events = lease_writer
        .subscribe()
        .expect("a shared store hands out subscriptions");
    let leases =
        decode::watch::<FencedLease>(client.clone(), ns.clone(), wc.clone(), unreadable.clone())
            .modify(prune)
            .reflect_shared(lease_writer);

    // Claim and pod events, deletions included (a shared store's subscribers only see
    // changes, and a deleted claim or pod is exactly what must hand a lease over at once).
    let (lease_triggers, lease_trigger_events) =
        tokio::sync::mpsc::unbounded_channel::<ObjectRef<FencedLease>>();
    let heartbeats = Arc::new(Heartbeats::default());
    let (claim_store, claim_writer) = reflector::store_shared::<FencedLeaseClaim>(SHARED_BUFFER);
    let claim_events = claim_writer
        .subscribe()
        .expect("a shared store hands out subscriptions");
    let observer = heartbeats.clone();
    let claims_stream =
        decode::watch::<FencedLeaseClaim>(client.clone(), ns.clone(), wc.clone(), unreadable)
            .modify(prune)
            .reflect_shared(claim_writer)
            .inspect_ok({
                let lease_triggers = lease_triggers.clone();
                move |event| {
                    observe_heartbeats(&observer, event);
                    for claim in touched(event) {
                        if let Some(ns) = claim.metadata.namespace.as_deref() {
                            let _ = lease_triggers
                                .send(ObjectRef::new(&claim.spec.lease_name).within(ns));
                        }
                    }
                }
            });

    let (pod_store, pod_writer) = reflector::store_shared::<PartialObjectMeta<Pod>>(SHARED_BUFFER);
    let claims_for_pods = claim_store.clone();
    let pods = watcher(api::<PartialObjectMeta<Pod>>(&client, ns), wc)
        .default_backoff()
        .modify(prune)
        .reflect_shared(pod_writer)
        .inspect_ok(move |event| {
            for pod in touched(event) {
                for lease in leases_of_pod(pod, &claims_for_pods) {
                    let _ = lease_triggers.send(lease);
                }
            }
        });

    let ctx = Arc::new(Context {
        client: client.clone(),
        leases: lease_store.clone(),
        claims: claim_store.clone(),
        pods: pod_store.clone(),
        heartbeats,
        recorder,
        metrics,
        api_timeout: settings.api_timeout,
        state_namespace: settings.state_namespace.clone(),
        synced: Default::default(),
        fence_bindings: super::fence_binding::FenceBindings::start(
            client.clone(),
            ns.clone(),
            settings.api_timeout,
            stop.clone(),
        ),
    });

    let watches = [
        drive("fencedleases", leases, stop.clone()),
        drive("fencedleaseclaims", claims_stream, stop.clone()),
        drive("pods", pods, stop.clone()),
    ];

    let sync_ctx = ctx.clone();
    let (ls, cs, ps) = (lease_store.clone(), claim_store.clone(), pod_store.clone());
    tokio::spawn(async move {
        let started = Instant::now();
        let (l, c, p) = futures::join!(wait_synced(&ls), wait_synced(&cs), wait_synced(&ps));
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

    let resync =
        futures::stream::once(future::ready(())).chain(tokio_stream_interval(settings.resync));
    let lease_controller = Controller::for_shared_stream(lease_events, lease_store)
        .reconcile_on(tokio_stream_from(lease_trigger_events))
        .reconcile_all_on(resync)
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconcile::reconcile, reconcile::error_policy, ctx.clone())
        .for_each(|result| {
            match result {
                // A claim names a lease that does not exist: the claim controller reports it.
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

    let claim_controller = Controller::for_shared_stream(claim_events, claim_store)
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(claims::reconcile, claims::error_policy, ctx.clone())
        .for_each(|result| {
            if let Err(e) = result
                && !matches!(e, kube::runtime::controller::Error::ReconcilerFailed(..))
            {
                warn!(error = %e, "claim controller");
            }
            future::ready(())
        });

    info!(namespace = ?settings.namespace, "controllers started");
    future::join(lease_controller, claim_controller).await;
    stop.cancel();
    for watch in watches {
        let _ = watch.await;
    }
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
    recorder: Recorder,
    metrics: Arc<Metrics>,
    timeout: Duration,
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
        let recorder = recorder.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(timeout, recorder.publish(&event, &reference)).await;
        });
    }
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

fn observe_heartbeats(heartbeats: &Heartbeats, event: &watcher::Event<FencedLeaseClaim>) {
    let now = Instant::now();
    tracing::trace!(event = ?std::mem::discriminant(event), "claim event");
    match event {
        watcher::Event::Apply(claim) | watcher::Event::InitApply(claim) => {
            if let Some(uid) = &claim.metadata.uid {
                let beat = claim.spec.renew_time.as_ref().map(|t| t.0.to_string());
                heartbeats.observe(uid, beat.as_deref(), now);
            }
        }
        watcher::Event::Delete(claim) => {
            if let Some(uid) = &claim.metadata.uid {
                heartbeats.forget(uid);
            }
        }
        watcher::Event::Init | watcher::Event::InitDone => {}
    }
}

fn tokio_stream_interval(every: Duration) -> impl Stream<Item = ()> + Send {
    futures::stream::unfold((), move |()| async move {
        tokio::time::sleep(every).await;
        Some(((), ()))
    })
}
