//! Regression tests for what the safety suite (tests/safety/jepsen) found, each the smallest
//! scenario that shows it, with the seed of the run that found it.

use crate::common;

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

/// A lease that fences a kind with a selector refuses no write to an object of that kind it
/// does not select (I12), cluster-admin's or a pod's, while it still refuses a pod that does
/// not hold it a selected one (I11). Found by the collateral check of the safety suite (seed
/// 3801, short profile, on ccbf71f): its lease `d` fences Secrets with a selector, and every
/// write to a Secret `d` does not select was refused, 422 `... resulted in error: no such key:
/// subResource`: the selector's match condition in the lease's kinds policy reads
/// `request.subResource`, which a request without a subresource does not have, so the
/// condition fails to evaluate and the policy (`failurePolicy: Fail`) refuses the write.
#[tokio::test]
async fn a_selector_fence_refuses_no_write_to_an_object_it_does_not_select() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, PostParams};

    let ns = TestNamespace::new("selector-collateral").await;
    ns.with_fence_policies().await;
    let pods = ns.app_pods(&["other"]).await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let out = ns.kubectl_apply(
        "apiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata: {name: books}\nspec:\n  leaseDurationSeconds: 5\n  fence:\n    resources: [{resource: configmaps}]\n    selector: {matchLabels: {app: books}}\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config_map = |name: &str, app: &str| -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"app": app}},
            "data": {"k": "v"},
        }))
        .unwrap()
    };
    let admin = ns.api::<ConfigMap>();
    admin
        .create(&PostParams::default(), &config_map("selected", "books"))
        .await
        .expect("the admin creates a selected ConfigMap");
    let as_pod: Api<ConfigMap> = Api::namespaced(ns.client_as_pod(&pods[0]).await, &ns.name);
    let patch =
        |n: u32| kube::api::Patch::Merge(serde_json::json!({"data": {"k": format!("v{n}")}}));

    // The lease's fence is in force: the pod, which does not hold it, is refused the
    // selected ConfigMap.
    let mut n = 0;
    let refused = wait_for("the pod refused the selected ConfigMap", WAIT, || {
        n += 1;
        let (as_pod, patch) = (as_pod.clone(), patch(n));
        async move {
            match as_pod
                .patch("selected", &PatchParams::default(), &patch)
                .await
            {
                Err(kube::Error::Api(e)) if e.code != 404 => Some(e.message),
                _ => None,
            }
        }
    })
    .await;

    // Nothing else of the kind is refused, to anyone.
    let mut refusals = vec![];
    match admin
        .create(&PostParams::default(), &config_map("other", "web"))
        .await
    {
        Ok(_) => {
            for (who, api) in [("cluster-admin", &admin), ("pod other", &as_pod)] {
                if let Err(e) = api.patch("other", &PatchParams::default(), &patch(0)).await {
                    refusals.push(format!("{who}'s patch of ConfigMap other: {e}"));
                }
            }
        }
        Err(e) => refusals.push(format!("cluster-admin's create of ConfigMap other: {e}")),
    }
    assert!(
        refusals.is_empty(),
        "lease books fences ConfigMaps labelled app=books only, yet refused writes to ConfigMap other (app=web):\n{}",
        refusals.join("\n")
    );
    assert!(
        refused.contains("does not hold"),
        "the pod was refused the selected ConfigMap, but not by the identity rule: {refused}"
    );
}
