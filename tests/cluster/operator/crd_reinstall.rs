//! I1 across the CRDs being uninstalled and installed again: every FencedLease is deleted
//! with its CRD, yet a lease re-created under the same name continues above its last token.
//! A test binary of its own: it removes the CRDs cluster-wide, so nothing else may run
//! beside it (cargo runs test binaries one after another).

use crate::common;

use std::time::Duration;

use common::operator::OperatorProcess;
use common::{TestNamespace, control_plane, wait_for};
use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

async fn grant_one(ns: &TestNamespace, claim: &str) -> i64 {
    ns.create_claim(claim, "l", None).await;
    let token = wait_for(&format!("{claim} granted"), WAIT, || {
        ns.granted_token(claim)
    })
    .await;
    ns.api::<FencedLeaseClaim>()
        .delete(claim, &DeleteParams::default())
        .await
        .unwrap();
    token
}

#[tokio::test]
async fn i1_tokens_keep_growing_across_a_crd_reinstall() {
    let ns = TestNamespace::new("crd-reinstall").await;
    // Cluster-wide, so it also finalizes leases other tests left behind and the CRD can go.
    let op = OperatorProcess::start(&ns.name, &["--all-namespaces"]);
    // Tokens far above the wall clock in ms (the other floor of a token): only the record
    // the finalizer keeps can carry them across the reinstall.
    const MIN_TOKEN: i64 = 1 << 51;
    ns.kubectl_apply(&format!(
        "apiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata: {{name: l}}\nspec: {{leaseDurationSeconds: 15, minToken: {MIN_TOKEN}}}\n"
    ));
    let mut last = MIN_TOKEN;
    for claim in ["a", "b", "c"] {
        let token = grant_one(&ns, claim).await;
        assert!(token > last, "{token} after {last}");
        last = token;
    }
    // One still held when the CRDs go: its claim goes with the claims' CRD, and the lease's
    // finalizer, reading the holder's claim back, meets the resource's own 404. (It waited on
    // that read for good, so the leases' CRD never went.)
    ns.create_claim("held", "l", None).await;
    let held = wait_for("held granted", WAIT, || ns.granted_token("held")).await;
    assert!(held > last, "{held} after {last}");
    last = held;

    let cp = control_plane();
    let out = cp
        .kubectl_cmd()
        .args([
            "delete",
            "crd",
            "fencedleases.fencing.dev",
            "fencedleaseclaims.fencing.dev",
            "--timeout=60s",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "delete CRDs: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        op.log_text()
    );
    cp.install_crds();

    // The CRD was just created: the first writes may still meet a discovery gap.
    wait_for("the re-installed CRD to serve", WAIT, || async {
        let lease: FencedLease = serde_json::from_value(json!({
            "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease", "metadata": {"name": "l"}, "spec": {}
        }))
        .unwrap();
        ns.api::<FencedLease>().create(&PostParams::default(), &lease).await.ok()
    })
    .await;
    assert_eq!(
        grant_one(&ns, "d").await,
        last + 1,
        "the token continues above the last one issued before the reinstall"
    );
}
