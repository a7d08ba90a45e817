//! The operator's own identity may change only the token annotations of a pod.

use super::*;

/// A ServiceAccount `op` of `ns` bound to exactly the ClusterRoles of
/// deploy/rbac/operator.yaml, with a token bound to no pod, once its rules are in force.
async fn operator_identity(ns: &TestNamespace, cleanup: &mut ClusterObjects) -> Client {
    let roles = ["fenced-lease-operator", "fenced-lease-operator-fences"];
    ns.create_service_account("op").await;
    bind_operator_cluster_roles(ns, "op", &roles, cleanup);
    let op = ns.client_as("op", None).await;
    for role in roles {
        wait_role_in_force(&op, &ns.name, &operator_rbac_document("ClusterRole", role)).await;
    }
    op
}

/// Issue 38, item 8 (I12): the operator's identity can do no more than its job with a pod. A
/// ServiceAccount bound to exactly the ClusterRoles of deploy/rbac/operator.yaml may write a
/// pod's `token.fencing.dev/*` annotation, and nothing else of it: a patch of its image, a
/// label or another annotation is refused 403.
#[tokio::test]
async fn the_operators_identity_may_change_only_token_annotations_of_a_pod() {
    let ns = TestNamespace::new("sec-oppod").await;
    ns.with_fence_policies().await;
    let mut cleanup = ClusterObjects::default();
    ns.create_pod_as("target", "workload").await;
    let op = operator_identity(&ns, &mut cleanup).await;
    let pods: Api<Pod> = Api::namespaced(op, &ns.name);

    // Its job: the token annotation.
    let key = token_annotation_key("books");
    accepted_within(WAIT, || {
        merge_patch(
            &pods,
            "target",
            json!({"metadata": {"annotations": {key.clone(): "5"}}}),
        )
    })
    .await
    .unwrap_or_else(|last| panic!("the operator's identity cannot annotate a pod: {last}"));

    let mut findings = Findings::default();
    let image = pods
        .patch(
            "target",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"containers": [{"name": "main", "image": "example.invalid/evil:1"}]}})),
        )
        .await;
    let label = merge_patch(
        &pods,
        "target",
        json!({"metadata": {"labels": {"evil": "yes"}}}),
    )
    .await;
    let other = merge_patch(
        &pods,
        "target",
        json!({"metadata": {"annotations": {"other/x": "y"}}}),
    )
    .await;
    for (what, result) in [
        ("patch the pod's image", image.map(drop)),
        ("add a label to the pod", label.map(drop)),
        ("add the annotation other/x to the pod", other.map(drop)),
    ] {
        findings.check(
            refusal(&result).is_some_and(|(code, _)| code == 403),
            || format!("the operator's identity may {what}: {}", describe(&result)),
        );
    }
    let now = ns.api::<Pod>().get("target").await.unwrap();
    let image = now.spec.unwrap().containers[0].image.clone();
    findings.check(image.as_deref() == Some("example.invalid/holder:1"), || {
        format!("the target pod's image is now {image:?}")
    });
    findings.finish();
}
