//! I1 across an apiserver and etcd restart: the operator loses the API, gets it back with the
//! same data, and goes on issuing tokens above the last one. A test binary of its own: it
//! restarts the shared control plane, so nothing else may run beside it (cargo runs test
//! binaries one after another).

use crate::common;

use std::time::Duration;

use common::operator::OperatorProcess;
use common::{TestNamespace, control_plane, wait_for};
use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use kube::api::DeleteParams;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn i1_tokens_survive_an_apiserver_and_etcd_restart() {
    let ns = TestNamespace::new("cp-restart").await;
    let op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("l", 30);
    ns.create_claim("a", "l", None).await;
    ns.create_claim("b", "l", None).await;
    let first = wait_for("a granted", WAIT, || ns.granted_token("a")).await;

    // Same data directory and ports.
    let out = control_plane().restart_command().output().unwrap();
    assert!(
        out.status.success(),
        "restart: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The API is back with its data; the operator's watches resume.
    let lease = wait_for("the lease readable again", WAIT, || async {
        ns.api::<FencedLease>().get("l").await.ok()
    })
    .await;
    assert_eq!(lease.status.unwrap().fencing_token, first);
    ns.api::<FencedLeaseClaim>()
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    let second = wait_for("b granted after the restart", WAIT, || {
        ns.granted_token("b")
    })
    .await;
    assert!(second > first, "{second} after {first}");
    ns.create_claim("c", "l", None).await;
    ns.api::<FencedLeaseClaim>()
        .delete("b", &DeleteParams::default())
        .await
        .unwrap();
    let third = wait_for("c granted", WAIT, || ns.granted_token("c")).await;
    assert!(third > second, "{third} after {second}");
    assert!(!op.log_text().contains("panicked"), "{}", op.log_text());
}
