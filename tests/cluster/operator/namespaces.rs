//! An operator serving several namespaces (`-n a -n b`): one watch per namespace, read as one.
//! It grants in those namespaces and in no other, and a relist of one namespace's watch (every
//! watch relists after an apiserver restart) empties no other namespace's cache. A test binary
//! of its own: it restarts the shared control plane, so nothing else may run beside it.

use crate::common;

use std::time::Duration;

use common::operator::OperatorProcess;
use common::{TestNamespace, control_plane, http_get, wait_for};
use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use kube::api::DeleteParams;

const WAIT: Duration = Duration::from_secs(60);

/// A lease `l` with a first claim and a second one that waits behind it.
async fn lease_with_two_claims(ns: &TestNamespace) {
    ns.create_lease("l", 30);
    ns.create_claim("first", "l", None).await;
    ns.create_claim("second", "l", None).await;
}

async fn hand_over(ns: &TestNamespace) -> i64 {
    ns.api::<FencedLeaseClaim>()
        .delete("first", &DeleteParams::default())
        .await
        .unwrap();
    let what = format!("the hand-over in {}", ns.name);
    wait_for(&what, WAIT, || ns.granted_token("second")).await
}

fn holder_series(ns: &TestNamespace) -> String {
    format!(
        r#"fenced_lease_holders{{namespace="{}",lease="l"}} 1"#,
        ns.name
    )
}

#[tokio::test]
async fn serves_exactly_the_listed_namespaces_across_a_relist_of_each() {
    let a = TestNamespace::new("ns-served-a").await;
    let b = TestNamespace::new("ns-served-b").await;
    let other = TestNamespace::new("ns-not-served").await;
    // Everything exists before the operator starts: its first lists must fill one cache.
    for ns in [&a, &b, &other] {
        lease_with_two_claims(ns).await;
    }
    let op = OperatorProcess::start(&a.name, &["--namespace", &b.name]);
    let port = op.http_port().await;
    for ns in [&a, &b] {
        let what = format!("the first claim granted in {}", ns.name);
        wait_for(&what, WAIT, || ns.granted_token("first")).await;
    }
    let served = [holder_series(&a), holder_series(&b)];
    wait_for("both namespaces' leases in /metrics", WAIT, || async {
        let (_, body) = http_get(port, "/metrics").await?;
        served.iter().all(|s| body.contains(s)).then_some(())
    })
    .await;

    // Every watch relists after an apiserver restart (its watch cache starts over).
    let out = control_plane().restart_command().output().unwrap();
    assert!(
        out.status.success(),
        "restart: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("the API back", WAIT, || async {
        a.api::<FencedLease>().get("l").await.ok()
    })
    .await;

    // Both namespaces are still in the operator's cache: each hands over at once.
    let tokens = [hand_over(&a).await, hand_over(&b).await];
    assert!(tokens.iter().all(|t| *t > 0), "{tokens:?}");
    let (_, body) = http_get(port, "/metrics").await.expect("/metrics");
    for series in &served {
        assert!(body.contains(series), "{series} missing from:\n{body}");
    }
    // The namespace not served: nothing granted, nothing reported, no claim touched.
    assert!(!body.contains(&other.name), "{body}");
    for claim in ["first", "second"] {
        let claim = other.api::<FencedLeaseClaim>().get(claim).await.unwrap();
        assert!(claim.status.is_none(), "{:?}", claim.status);
    }
    let lease = other.api::<FencedLease>().get("l").await.unwrap();
    assert!(lease.status.is_none(), "{:?}", lease.status);
    assert!(!op.log_text().contains("panicked"), "{}", op.log_text());
}
