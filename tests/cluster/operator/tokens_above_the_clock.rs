//! I1 where the clock does not cover a token: a name never issues a token at or below one it
//! issued before, even when that token was above the wall clock (a `minToken` set ahead of it,
//! or a record above it) and the lease was then deleted with its finalizer stripped, so that
//! its finalizer recorded nothing. The operator writes such a token into its token record
//! before it grants it (issue 55, item 1).

use crate::common;

use std::time::Duration;

use common::operator::OperatorProcess;
use common::{TestNamespace, wait_for};
use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
/// About 2096 in ms since the Unix epoch: above the clock for the rest of the century.
const AHEAD: i64 = 4_000_000_000_000;

async fn create_lease(ns: &TestNamespace, name: &str, spec: serde_json::Value) {
    let lease: FencedLease = serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("lease object");
    ns.api::<FencedLease>()
        .create(&PostParams::default(), &lease)
        .await
        .unwrap_or_else(|e| panic!("create lease {name}: {e}"));
}

/// Claims lease `lease` as `claim` and waits for its grant; the token. The claim is deleted
/// afterwards, so that it does not wait on the next lease of that name.
async fn granted(ns: &TestNamespace, lease: &str, claim: &str) -> i64 {
    ns.create_claim(claim, lease, None).await;
    let token = {
        let _beat = ns.keep_beating(claim, Duration::from_secs(1));
        wait_for(&format!("{claim} granted"), WAIT, || {
            ns.granted_token(claim)
        })
        .await
    };
    let claims = ns.api::<FencedLeaseClaim>();
    let _ = claims.delete(claim, &DeleteParams::default()).await;
    wait_for(&format!("claim {claim} gone"), WAIT, || async {
        claims.get_opt(claim).await.ok()?.is_none().then_some(())
    })
    .await;
    token
}

/// Deletes lease `name` with its finalizer stripped, as a user can: stripped again until the
/// lease is gone, since the operator puts its finalizer back on a live lease.
async fn delete_stripped(ns: &TestNamespace, name: &str) {
    let leases = ns.api::<FencedLease>();
    let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    leases
        .patch(name, &PatchParams::default(), &strip)
        .await
        .expect("strip the finalizers");
    leases
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete the lease");
    wait_for(&format!("lease {name} gone"), WAIT, || async {
        let lease = leases.get_opt(name).await.ok()?;
        if lease.is_some_and(|l| l.metadata.finalizers.is_some_and(|f| !f.is_empty())) {
            let _ = leases.patch(name, &PatchParams::default(), &strip).await;
        }
        leases.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// The sequence: `minToken` above the clock issues minToken + 1; the lease goes with
/// its finalizer stripped (no record written at deletion); re-created under the same name
/// without `minToken`, its first token must still be above the first lease's.
#[tokio::test]
async fn a_lease_deleted_without_its_finalizer_never_reissues_a_token_above_the_clock() {
    let ns = TestNamespace::new("i1-ahead").await;
    let _op = OperatorProcess::start(&ns.name, &[]);

    create_lease(
        &ns,
        "books",
        json!({"leaseDurationSeconds": 30, "minToken": AHEAD}),
    )
    .await;
    let first = granted(&ns, "books", "a").await;
    assert_eq!(first, AHEAD + 1, "the first token above minToken");
    delete_stripped(&ns, "books").await;

    create_lease(&ns, "books", json!({"leaseDurationSeconds": 30})).await;
    let again = granted(&ns, "books", "b").await;
    assert!(
        again > first,
        "lease books, re-created after a delete with its finalizer stripped, issued {again}, \
         not above {first}, which its first lease issued (I1)"
    );
}

/// A record above the clock carries on: the first lease's finalizer records its token; the
/// second, without `minToken`, issues above that record (still above the clock) and is
/// deleted with its finalizer stripped; the third must issue above the second's token.
#[tokio::test]
async fn a_token_above_the_clock_from_a_record_is_recorded_before_it_is_issued() {
    let ns = TestNamespace::new("i1-chain").await;
    let _op = OperatorProcess::start(&ns.name, &[]);

    create_lease(
        &ns,
        "chain",
        json!({"leaseDurationSeconds": 30, "minToken": AHEAD}),
    )
    .await;
    let first = granted(&ns, "chain", "a").await;
    ns.delete_lease("chain").await;

    create_lease(&ns, "chain", json!({"leaseDurationSeconds": 30})).await;
    let second = granted(&ns, "chain", "b").await;
    assert!(second > first, "{second} after the record of {first}");
    delete_stripped(&ns, "chain").await;

    create_lease(&ns, "chain", json!({"leaseDurationSeconds": 30})).await;
    let third = granted(&ns, "chain", "c").await;
    assert!(
        third > second,
        "lease chain's third object issued {third}, not above {second}, which the second \
         issued before it was deleted with its finalizer stripped (I1)"
    );
}
