//! What a heartbeat and a grant cost in apiserver writes. Counted with watches on this
//! test's namespace (every write that changes a lease, a claim or an Event there shows up as
//! one watch event), so other tests' writes to the same apiserver do not count.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::operator::OperatorProcess;
use common::{TestNamespace, wait_for};
use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
const HEARTBEATS: u64 = 20;

/// Counts every change of `api`'s objects from now on, into `count`.
async fn count_changes<K>(api: Api<K>, count: Arc<AtomicU64>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let rv = api
        .list_metadata(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("a list resourceVersion");
    let stream = api
        .watch(&WatchParams::default().timeout(290), &rv)
        .await
        .expect("watch");
    tokio::spawn(async move {
        let mut stream = stream.boxed();
        while let Ok(Some(event)) = stream.try_next().await {
            if matches!(
                event,
                WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_)
            ) {
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
}

/// The count once it has not moved for a second (the operator has settled).
async fn settled(count: &AtomicU64) -> u64 {
    let mut last = count.load(Ordering::SeqCst);
    let mut since = Instant::now();
    let deadline = Instant::now() + WAIT;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = count.load(Ordering::SeqCst);
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= Duration::from_secs(1) {
            return now;
        }
        assert!(Instant::now() < deadline, "writes never settled");
    }
}

#[tokio::test]
async fn a_heartbeat_costs_one_apiserver_write() {
    let _counted = COUNTED.lock().await; // its waits read claims
    let ns = TestNamespace::new("hb-writes").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("l", 60);
    ns.create_claim("holder", "l", None).await;
    wait_for("holder granted", WAIT, || ns.granted_token("holder")).await;
    ns.create_claim("waiter", "l", None).await;
    wait_for("waiter queued", WAIT, || async {
        let claim = ns.api::<FencedLeaseClaim>().get("waiter").await.ok()?;
        (claim.status?.queue_position == Some(1)).then_some(())
    })
    .await;

    let writes = Arc::new(AtomicU64::new(0));
    count_changes(ns.api::<FencedLeaseClaim>(), writes.clone()).await;
    count_changes(ns.api::<FencedLease>(), writes.clone()).await;
    count_changes(ns.api::<Event>(), writes.clone()).await;
    let before = settled(&writes).await;
    for _ in 0..HEARTBEATS {
        let beat = json!({"spec": {"renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}});
        ns.api::<FencedLeaseClaim>()
            .patch("holder", &PatchParams::default(), &Patch::Merge(&beat))
            .await
            .expect("heartbeat");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = settled(&writes).await;
    eprintln!(
        "{HEARTBEATS} heartbeats: {} writes to leases, claims and Events",
        after - before
    );
    assert_eq!(
        after - before,
        HEARTBEATS,
        "each heartbeat should cost exactly its own write"
    );
}

/// Held by the tests that count the apiserver's requests by verb (across the cluster: this test
/// binary runs alone, and its tests that send or cause such requests wait for it in turn).
static COUNTED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The apiserver's count of requests whose `apiserver_request_total` labels include every one
/// of `labels` (e.g. `resource="pods"`).
async fn requests(client: &kube::Client, labels: &[&str]) -> f64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client
        .request_text(request)
        .await
        .expect("apiserver /metrics");
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The apiserver's count of PATCH requests to pods.
async fn pod_patches(client: &kube::Client) -> f64 {
    requests(client, &[r#"resource="pods""#, r#"verb="PATCH""#]).await
}

/// A silent holder's expiry at its deadline costs its claim's `Expired` write and the grant to
/// the next (plus that claim's status and the Events), and no read of the claim: the expiry is
/// written on the version the operator already has, preconditioned on it (I9). Nor is any
/// claim status refused afterwards (the CRD refuses any change of an `Expired` claim; a repair
/// from a cache that does not show the expiry yet would be one refused write each).
#[tokio::test]
async fn an_expiry_reads_no_claim_and_has_no_write_refused() {
    let _counted = COUNTED.lock().await;
    let ns = TestNamespace::new("expiry-requests").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("l", 2);
    ns.create_claim("holder", "l", None).await;
    let holder_of = |ns: &TestNamespace| {
        let leases = ns.api::<FencedLease>();
        async move {
            let lease = leases.get("l").await.ok()?;
            lease.status?.holder.map(|h| h.claim)
        }
    };
    wait_for("the holder's grant", WAIT, || async {
        (holder_of(&ns).await? == "holder").then_some(())
    })
    .await;
    let claim_reads = [
        r#"resource="fencedleaseclaims""#,
        r#"subresource="""#,
        r#"verb="GET""#,
    ];
    let refused = [r#"resource="fencedleaseclaims""#, r#"code="422""#];
    let (reads, refusals) = (
        requests(&ns.client, &claim_reads).await,
        requests(&ns.client, &refused).await,
    );
    ns.create_claim("waiter", "l", None).await;
    let claims = ns.api::<FencedLeaseClaim>();
    wait_for("the waiter's grant", WAIT, || async {
        let beat = json!({"spec": {"renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}});
        claims
            .patch("waiter", &PatchParams::default(), &Patch::Merge(&beat))
            .await
            .ok()?;
        (holder_of(&ns).await? == "waiter").then_some(())
    })
    .await;
    // The Expired write and its watch events settle, and any repair after them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (reads, refusals) = (
        requests(&ns.client, &claim_reads).await - reads,
        requests(&ns.client, &refused).await - refusals,
    );
    eprintln!("MEASURED an expiry: {reads} claim reads, {refusals} refused claim writes");
    assert_eq!(reads, 0.0, "the expiry read no claim from the apiserver");
    assert_eq!(refusals, 0.0, "no claim write was refused");
}

/// A grant to a claim that names a pod writes the pod's token annotation once: the reconcile
/// that the grant's own lease write triggers finds the pod cache behind that annotation and
/// leaves the pod to its watch event, instead of writing the same annotation again (as it
/// did, at 1.92 pod writes per grant over 10,000 grants).
#[tokio::test]
async fn a_grant_writes_the_holder_pods_annotation_once() {
    use k8s_openapi::api::core::v1::Pod;
    let _counted = COUNTED.lock().await;
    let ns = TestNamespace::new("pod-writes").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods: Api<Pod> = ns.api();
    let mut writes = 0;
    for i in 0..5 {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("worker-{i}")},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        }))
        .unwrap();
        pods.create(&Default::default(), &pod)
            .await
            .expect("create pod");
        let lease = format!("l-{i}");
        ns.create_lease(&lease, 60);
        let changes = Arc::new(AtomicU64::new(0));
        count_changes(ns.api::<FencedLeaseClaim>(), changes.clone()).await;
        count_changes(ns.api::<FencedLease>(), changes.clone()).await;
        count_changes(pods.clone(), changes.clone()).await;
        let before = pod_patches(&ns.client).await;
        let claim = format!("c-{i}");
        ns.create_claim(&claim, &lease, Some(&format!("worker-{i}")))
            .await;
        let key = format!("token.fencing.dev/{lease}");
        let token = wait_for("the grant", WAIT, || ns.granted_token(&claim)).await;
        wait_for("the pod's token annotation", WAIT, || async {
            let pod = pods.get(&format!("worker-{i}")).await.ok()?;
            (pod.metadata.annotations?.get(&key)? == &token.to_string()).then_some(())
        })
        .await;
        settled(&changes).await;
        let patches = pod_patches(&ns.client).await - before;
        eprintln!("grant {i}: {patches} pod writes");
        writes += patches as u64;
    }
    assert_eq!(writes, 5, "five grants to five pods: one pod write each");
}

/// A grant to a claim naming a pod, on a lease made while no operator ran (as when an operator
/// starts over thousands of them), costs four writes and an Event: the token finalizer on the
/// lease, which must be in place before the lease's first token is issued (I1 across deletion
/// and re-creation); the lease status (the grant); the claim's status; the pod's annotation.
#[tokio::test]
async fn a_grant_on_a_new_lease_costs_four_writes_and_an_event() {
    use k8s_openapi::api::core::v1::Pod;
    let _counted = COUNTED.lock().await;
    let ns = TestNamespace::new("grant-writes").await;
    let pods: Api<Pod> = ns.api();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "worker"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }))
    .unwrap();
    pods.create(&Default::default(), &pod)
        .await
        .expect("create pod");
    ns.create_lease("l", 60);
    ns.create_claim("c", "l", Some("worker")).await;

    let writes = Arc::new(AtomicU64::new(0));
    count_changes(ns.api::<FencedLeaseClaim>(), writes.clone()).await;
    count_changes(ns.api::<FencedLease>(), writes.clone()).await;
    count_changes(pods.clone(), writes.clone()).await;
    count_changes(ns.api::<Event>(), writes.clone()).await;
    let before = settled(&writes).await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let token = wait_for("the grant", WAIT, || ns.granted_token("c")).await;
    wait_for("the pod's token annotation", WAIT, || async {
        let pod = pods.get("worker").await.ok()?;
        (pod.metadata.annotations?.get("token.fencing.dev/l")? == &token.to_string()).then_some(())
    })
    .await;
    let after = settled(&writes).await;
    eprintln!("MEASURED a grant on a new lease: {} writes", after - before);
    assert_eq!(
        after - before,
        5,
        "the finalizer, the lease status, the claim status, the pod annotation and one Event"
    );
    let lease = ns.api::<FencedLease>().get("l").await.expect("lease");
    assert_eq!(
        lease.metadata.finalizers.as_deref(),
        Some(["fencing.dev/token-high-water-mark".to_string()].as_slice()),
        "the token finalizer"
    );
}

/// Lease reconciles so far, from the operator's `/metrics`.
async fn reconciles(op: &OperatorProcess) -> u64 {
    op.metric("fenced_lease_reconcile_duration_seconds_count")
        .await
        .expect("the reconcile count") as u64
}

/// A hand-over costs one reconcile of the lease, the one its release triggers: the watch
/// events of the operator's own writes (the lease status, the new holder's claim status, the
/// waiters' queue positions) trigger none, since the reconcile that wrote them decided on
/// everything before them. On a lease with a long queue every reconcile compares every
/// claim; before, each hand-over cost three or more.
#[tokio::test]
async fn a_hand_over_costs_one_reconcile() {
    const WAITERS: usize = 20;
    const HANDOVERS: usize = 10;
    let _counted = COUNTED.lock().await;
    let ns = TestNamespace::new("handover-reconciles").await;
    let op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("l", 60);
    for i in 0..=WAITERS {
        ns.create_claim(&format!("c-{i:02}"), "l", None).await;
    }
    wait_for("the first grant", WAIT, || ns.granted_token("c-00")).await;
    let changes = Arc::new(AtomicU64::new(0));
    count_changes(ns.api::<FencedLeaseClaim>(), changes.clone()).await;
    count_changes(ns.api::<FencedLease>(), changes.clone()).await;
    let claims = ns.api::<FencedLeaseClaim>();
    wait_for("every waiter's place in the queue", WAIT, || async {
        let list = claims.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .all(|c| c.status.as_ref().is_some_and(|s| s.phase.is_some()))
            .then_some(())
    })
    .await;
    settled(&changes).await;
    let before = reconciles(&op).await;
    for i in 0..HANDOVERS {
        claims
            .delete(&format!("c-{i:02}"), &Default::default())
            .await
            .expect("release");
        let next = format!("c-{:02}", i + 1);
        wait_for("the next grant", WAIT, || ns.granted_token(&next)).await;
    }
    // The queue positions are written once the queue is still, and their events settle.
    settled(&changes).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    settled(&changes).await;
    let spent = reconciles(&op).await - before;
    eprintln!("MEASURED {HANDOVERS} hand-overs: {spent} lease reconciles");
    assert!(
        spent <= HANDOVERS as u64 + 2,
        "{spent} reconciles for {HANDOVERS} hand-overs: one each, and at most two more"
    );
}
