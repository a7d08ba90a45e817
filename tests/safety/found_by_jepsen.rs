//! Regression tests for what the safety suite (tests/safety/jepsen) found, each the smallest
//! scenario that shows it, with the seed of the run that found it.

#[path = "../common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::operator::OperatorProcess;
use common::{TestNamespace, wait_for};
use fenced_lease::api::FencedLease;
use fenced_lease::holder::{AcquireOptions, acquire};
use kube::api::{Patch, PatchParams};

const WAIT: Duration = Duration::from_secs(30);

/// A claim queued while the lease's duration was 3 s, granted after it was lowered to 1 s:
/// its term is 1 s (I10: the new duration applies from the next grant), so the holder must
/// pace its heartbeats and count its safe deadline on 1 s — not on the 3 s it read before it
/// queued. Otherwise it renews every 1 s against a 1 s term (the operator expires it although
/// it keeps renewing: I9) and believes it holds for up to 2.7 s after its last renew, long
/// after the next holder was granted (I6).
#[tokio::test]
async fn a_waiter_granted_after_the_duration_was_lowered_holds_by_its_term() {
    let ns = TestNamespace::new("lowered-waiter").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("l", 3);
    let client = ns.holder_client().await;
    let options = |who: &str| AcquireOptions::default().identity(who).wait(WAIT);
    let a = acquire(client.clone(), &ns.name, "l", options("A"))
        .await
        .expect("A acquires");
    let b = tokio::spawn({
        let (client, ns) = (client.clone(), ns.name.clone());
        async move { acquire(client, &ns, "l", options("B")).await }
    });
    wait_for("B to queue", WAIT, || async {
        let lease = ns.api::<FencedLease>().get("l").await.ok()?;
        (lease.status?.waiting == 1).then_some(())
    })
    .await;
    ns.api::<FencedLease>()
        .patch(
            "l",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"leaseDurationSeconds": 1}})),
        )
        .await
        .expect("lower the duration");
    a.release().await.expect("A releases");
    let b = b.await.expect("B's task").expect("B is granted");
    let term = ns
        .api::<FencedLease>()
        .get("l")
        .await
        .unwrap()
        .status
        .unwrap()
        .lease_duration_seconds;
    assert_eq!(term, Some(1), "B's term is the lowered duration");

    // I6: B's local deadline is within its 1 s term of now, whatever it read before.
    let ahead = b.time_left();
    assert!(
        ahead <= Duration::from_secs(1),
        "B counts itself the holder for {ahead:?} more, beyond its 1 s term"
    );
    // I9: B keeps renewing, so it is never expired.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        assert!(
            b.token().is_ok(),
            "B lost the lease although it kept renewing: {:?}",
            b.state()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A lease deleted while held and created again under the same name (the recreate-lease
/// nemesis, with a holder that cannot hear of the deletion): tokens continue above the old
/// ones (I1), and the name is kept (the finalizer stays) until the old holder's term has run
/// out, so the new lease is not granted while the old holder, cut off from the apiserver,
/// still counts itself the holder. The suite's holders are never partitioned, so they learn
/// of the deletion within milliseconds and the run did not show it; this test does (it
/// failed before the finalizer waited: B held while A had about 4.5 s left).
#[tokio::test]
async fn a_recreated_lease_is_not_granted_before_the_old_holders_deadline() {
    use common::proxy::Proxy;

    let ns = TestNamespace::new("recreated-held").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("l", 5);
    let a_proxy = Proxy::start(&ns).await;
    let a_client = a_proxy.client(&ns).await;
    let a = acquire(
        a_client,
        &ns.name,
        "l",
        AcquireOptions::default().identity("A").wait(WAIT),
    )
    .await
    .expect("A acquires");
    let a_token = a.token().expect("A holds");

    a_proxy.cut(); // A keeps running, but hears nothing more
    ns.delete_lease("l").await;
    ns.create_lease("l", 5);
    let b = acquire(
        ns.holder_client().await,
        &ns.name,
        "l",
        AcquireOptions::default().identity("B").wait(WAIT),
    )
    .await
    .expect("B acquires the re-created lease");
    let b_token = b.token().expect("B holds");
    assert!(
        b_token > a_token,
        "I1: B's token {b_token} after A's {a_token}"
    );
    assert!(
        a.token().is_err(),
        "B holds the re-created lease (token {b_token}) while A still holds token {a_token} for {:?} more",
        a.time_left()
    );
}
