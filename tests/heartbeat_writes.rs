//! A heartbeat costs one apiserver write: the holder's own. Counted with the apiserver's
//! `apiserver_request_total` (writes to fencing.dev objects and to Events), so this test
//! binary holds this one test only: other tests' writes would be counted too.

mod common;

use std::time::{Duration, Instant};

use common::operator::OperatorProcess;
use common::{TestNamespace, wait_for};
use fenced_lease::api::FencedLeaseClaim;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
const HEARTBEATS: u64 = 20;

/// Writes the apiserver has served to fencing.dev objects and Events, all verbs that write.
async fn writes(client: &kube::Client) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client
        .request_text(request)
        .await
        .expect("apiserver /metrics");
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains("group=\"fencing.dev\"") || l.contains("resource=\"events\""))
        .filter(|l| {
            ["POST", "PUT", "PATCH", "APPLY", "DELETE"]
                .iter()
                .any(|verb| l.contains(&format!("verb=\"{verb}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// The write count once it has not moved for a second (the operator has settled).
async fn settled_writes(client: &kube::Client) -> u64 {
    let mut last = writes(client).await;
    let mut since = Instant::now();
    let deadline = Instant::now() + WAIT;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = writes(client).await;
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

    let before = settled_writes(&ns.client).await;
    for _ in 0..HEARTBEATS {
        let beat = json!({"spec": {"renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}});
        ns.api::<FencedLeaseClaim>()
            .patch("holder", &PatchParams::default(), &Patch::Merge(&beat))
            .await
            .expect("heartbeat");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = settled_writes(&ns.client).await;
    eprintln!(
        "{HEARTBEATS} heartbeats: {} apiserver writes",
        after - before
    );
    assert_eq!(
        after - before,
        HEARTBEATS,
        "each heartbeat should cost exactly its own write"
    );
}
