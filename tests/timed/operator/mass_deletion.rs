//! Thousands of leases deleted at once (a namespace, a `deletecollection`) each take the
//! operator several writes to finalize: the last token recorded, the holder revoked, the
//! finalizer removed. Meanwhile a lease created elsewhere must still be granted at once, and
//! every deletion must still finish. Before the fix (issue 11) this wedged the operator for
//! good in 7 of 8 runs: kube-runtime's shared cache stopped feeding its controller when handed
//! a lease already gone, then blocked the lease watch. And with that fixed, the deletions,
//! queued into the controller all together, took its every slot, so a new lease waited
//! behind them in hash order: more than 4 s at 3,000 leases, more than 30 s at 10,000.

use crate::common;

use std::time::{Duration, Instant};

use common::TestNamespace;
use common::bulk::{create_all, new_lease_granted};
use common::operator::OperatorProcess;
use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

const LEASES: usize = 3_000;
const FINALIZER: &str = "fencing.dev/token-high-water-mark";
/// The operator adds a finalizer to each lease (and writes its status): 2 writes each.
const ALL_FINALIZED: Duration = Duration::from_secs(120);
/// A new lease's claim is granted in well under a second on an idle operator; this leaves
/// room for 2 shared cores. Behind 3,000 deletions it waited 10 s and more.
const PROBE_GRANTED: Duration = Duration::from_secs(4);
const ALL_DELETED: Duration = Duration::from_secs(180);

fn lease(name: &str) -> FencedLease {
    serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": name, "labels": {"batch": if name == "probe" { "probe" } else { "bulk" }}},
        "spec": {"leaseDurationSeconds": 300},
    }))
    .expect("lease object")
}

/// Leases of the bulk batch: how many there are, and how many carry the operator's finalizer.
async fn bulk(api: &Api<FencedLease>) -> (usize, usize) {
    let list = api
        .list_metadata(&ListParams::default().labels("batch=bulk"))
        .await
        .expect("list leases");
    let finalized = list
        .items
        .iter()
        .filter(|l| {
            l.metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == FINALIZER)
        })
        .count();
    (list.items.len(), finalized)
}

/// Marks every bulk lease deleted with `deletecollection`, calling again while some are not
/// (the apiserver ends a call at its request timeout); returns how many calls it took.
async fn delete_all(api: &Api<FencedLease>) -> usize {
    let bulk = ListParams::default().labels("batch=bulk");
    for call in 1..=5 {
        match api.delete_collection(&DeleteParams::default(), &bulk).await {
            Ok(_) => return call,
            Err(e) => eprintln!("deletecollection call {call} ended early: {e}"),
        }
        let unmarked = api
            .list_metadata(&bulk)
            .await
            .expect("list leases")
            .items
            .iter()
            .filter(|l| l.metadata.deletion_timestamp.is_none())
            .count();
        if unmarked == 0 {
            return call;
        }
    }
    panic!("5 deletecollection calls did not mark every lease deleted");
}

#[tokio::test]
async fn a_new_lease_is_granted_at_once_while_thousands_are_being_deleted() {
    let ns = TestNamespace::new("mass-deletion").await;
    let (leases, claims) = (ns.api::<FencedLease>(), ns.api::<FencedLeaseClaim>());
    let op = OperatorProcess::start(&ns.name, &[]);
    create_all(
        &leases,
        (0..LEASES).map(|i| lease(&format!("l-{i}"))).collect(),
    )
    .await;
    let started = Instant::now();
    while bulk(&leases).await.1 < LEASES {
        assert!(
            started.elapsed() < ALL_FINALIZED,
            "the operator put its finalizer on {} of {LEASES} leases in {ALL_FINALIZED:?}; log: {}",
            bulk(&leases).await.1,
            op.log.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // All at once, as a namespace's deletion goes: `deletecollection`, called again until every
    // lease is marked deleted, as the namespace controller does. The apiserver gives one call
    // 60 s and stops marking leases when they run out (in four runs here it marked 2,365-2,997 of 3,000 in
    // one call), so a single call is not enough on a slow machine. The operator finalizes
    // leases while the calls run. Deleted this way, the code before the fix wedged in 7 of 8
    // runs; 32 deletes at a time, in 0 of 2 (a new claim then still waited more than 4 s
    // behind the deletions, in hash order).
    let mut config = common::control_plane().admin_config().await;
    config.read_timeout = Some(Duration::from_secs(300));
    let patient: Api<FencedLease> =
        Api::namespaced(kube::Client::try_from(config).expect("client"), &ns.name);
    let collection = tokio::spawn(async move { delete_all(&patient).await });
    let deleting = Instant::now();
    // The new lease is asked for once the operator is finalizing: 100 leases gone.
    while bulk(&leases).await.0 > LEASES - 100 {
        assert!(
            deleting.elapsed() < ALL_DELETED,
            "no lease was finalized within {ALL_DELETED:?} of the deletion; log: {}",
            op.log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let granted = new_lease_granted(&leases, &claims, &lease("probe"), PROBE_GRANTED).await;
    let (left_then, _) = bulk(&leases).await;
    // The deletions still finish: none is starved by the pacing.
    let mut left = left_then;
    while left > 0 {
        assert!(
            deleting.elapsed() < ALL_DELETED,
            "{left} of {LEASES} deleted leases still there after {ALL_DELETED:?}; log: {}",
            op.log.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        left = bulk(&leases).await.0;
    }
    let took = deleting.elapsed();
    let calls = collection.await.expect("deletecollection task");
    eprintln!(
        "probe granted after {granted:?} with {left_then} of {LEASES} leases still being deleted; all {LEASES} deleted in {:.1} s ({calls} deletecollection calls)",
        took.as_secs_f64()
    );
    assert!(
        left_then > 0,
        "the {LEASES} deletions were done before the probe was granted: this test saw no contention (raise LEASES)"
    );
    assert!(
        granted.is_some(),
        "a claim of a new lease was not granted within {PROBE_GRANTED:?} while {left_then} of {LEASES} leases were being deleted; log: {}",
        op.log.display()
    );
}
