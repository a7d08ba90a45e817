//! A heartbeat costs one apiserver write: the holder's own. Counted with watches on this
//! test's namespace (every write that changes a lease, a claim or an Event there shows up as
//! one watch event), so other tests' writes to the same apiserver do not count.

mod common;

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
