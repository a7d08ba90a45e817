//! The operator runs with exactly the permissions of deploy/rbac/operator.yaml: grants,
//! hand-overs, pod annotations, Events, leader election and the token high-water mark.

use crate::common;

use std::time::Duration;

use common::operator::OperatorProcess;
use common::{TestNamespace, repo_root, wait_for};
use fenced_lease::api::{FencedLease, FencedLeaseClaim, token_annotation_key};
use fenced_lease_operator::admission::shipped;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

async fn create<
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
>(
    ns: &TestNamespace,
    object: serde_json::Value,
) where
    K::DynamicType: Default,
{
    let object: K = serde_json::from_value(object).unwrap();
    ns.api::<K>()
        .create(&PostParams::default(), &object)
        .await
        .expect("create");
}

/// ServiceAccount operator of `ns`, bound to exactly the roles of deploy/rbac/operator.yaml
/// (its ClusterRoles cluster-wide, its Role in `ns`). Returns its user name.
async fn bind_the_documented_roles(ns: &TestNamespace) -> String {
    let _ = ns.client_as_service_account("operator").await;
    let rbac = std::fs::read_to_string(repo_root().join("deploy/rbac/operator.yaml")).unwrap();
    let out = ns.kubectl_apply(&rbac);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bindings = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: fenced-lease-operator-{ns}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: fenced-lease-operator}}\n\
         subjects: [{{kind: ServiceAccount, name: operator, namespace: {ns}}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: fenced-lease-operator-fences-{ns}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: fenced-lease-operator-fences}}\n\
         subjects: [{{kind: ServiceAccount, name: operator, namespace: {ns}}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: fenced-lease-operator\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: fenced-lease-operator}}\n\
         subjects: [{{kind: ServiceAccount, name: operator, namespace: {ns}}}]\n",
        ns = ns.name
    );
    let out = ns.kubectl_apply(&bindings);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!("system:serviceaccount:{}:operator", ns.name)
}

/// Bindings reach the authorizer through an informer: waits until they are in force for
/// `subject`, so that any "forbidden" the operator logs afterwards is a permission it really
/// lacks.
async fn wait_bindings_in_force(ns: &TestNamespace, subject: &str) {
    for (verb, resource, sub) in [
        ("patch", "fencedleases.fencing.dev", ""),
        ("update", "fencedleases.fencing.dev", "status"),
        ("create", "configmaps", ""),
        (
            "watch",
            "validatingadmissionpolicybindings.admissionregistration.k8s.io",
            "",
        ),
        (
            "update",
            "validatingadmissionpolicies.admissionregistration.k8s.io/fenced-lease-kinds-15",
            "",
        ),
    ] {
        wait_for(
            &format!("{subject} may {verb} {resource} {sub}"),
            WAIT,
            || async {
                let out = ns
                    .kubectl()
                    .args([
                        "auth",
                        "can-i",
                        verb,
                        resource,
                        "--subresource",
                        sub,
                        "--as",
                        subject,
                    ])
                    .output()
                    .ok()?;
                out.status.success().then_some(())
            },
        )
        .await;
    }
}

/// Its admission objects only its own (I12): `subject` may create, delete or change no
/// admission object but the kinds slots' policies.
fn assert_no_admission_object_but_the_slots(ns: &TestNamespace, subject: &str) {
    for (verb, resource) in [
        ("create", "validatingadmissionpolicies"),
        (
            "delete",
            "validatingadmissionpolicies/fenced-lease-kinds-00",
        ),
        (
            "update",
            "validatingadmissionpolicies/fenced-lease-object-token",
        ),
        (
            "update",
            "validatingadmissionpolicies/fenced-lease-lease-token",
        ),
        ("create", "validatingadmissionpolicybindings"),
        (
            "update",
            "validatingadmissionpolicybindings/fenced-lease-kinds-00",
        ),
        (
            "delete",
            "validatingadmissionpolicybindings/fenced-lease-objects",
        ),
        ("create", "mutatingadmissionpolicies"),
    ] {
        let out = ns
            .kubectl()
            .args(["auth", "can-i", verb, resource, "--as", subject])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "no",
            "the operator may {verb} {resource}"
        );
    }
}

/// Lease l (fencing labelled objects and ConfigMaps), pod p, and claims a (for p) and b.
async fn a_lease_a_pod_and_two_claims(ns: &TestNamespace) {
    create::<FencedLease>(ns, json!({"apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease", "metadata": {"name": "l"}, "spec": {"fenceObjects": true, "fence": {"resources": [{"resource": "configmaps"}]}}})).await;
    create::<Pod>(ns, json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "example.invalid/x:1"}]}})).await;
    for (claim, pod) in [("a", Some("p")), ("b", None)] {
        let mut spec = json!({"leaseName": "l", "holderIdentity": claim});
        if let Some(pod) = pod {
            spec["podName"] = json!(pod);
        }
        create::<FencedLeaseClaim>(ns, json!({"apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim", "metadata": {"name": claim}, "spec": spec})).await;
    }
}

/// The kinds slot that lists `ns`, if one does.
async fn slot_listing(ns: &TestNamespace) -> Option<String> {
    let policies = Api::<ValidatingAdmissionPolicy>::all(ns.client.clone());
    for name in shipped::slot_names() {
        let policy = policies.get(&name).await.unwrap();
        if let Ok(Some(a)) = shipped::assignment(&policy)
            && a.namespaces.contains(&ns.name)
        {
            return Some(name);
        }
    }
    None
}

/// a is granted and its pod annotated, once a kinds slot lists the namespace (spec.fence);
/// released, b is granted above it. Returns b's token.
async fn grants_annotates_and_hands_over(ns: &TestNamespace) -> i64 {
    // RBAC bindings reach the authorizer through an informer; the operator retries.
    let token = wait_for("a granted", WAIT, || ns.granted_token("a")).await;
    assert!(token > 0);
    let key = token_annotation_key("l");
    wait_for("the pod annotated", WAIT, || async {
        let pod = ns.api::<Pod>().get("p").await.ok()?;
        (pod.metadata.annotations?.get(&key)? == &token.to_string()).then_some(())
    })
    .await;
    // spec.fence: granted once a kinds slot lists the namespace, which only the operator writes.
    assert!(
        slot_listing(ns).await.is_some(),
        "granted before a slot listed the namespace"
    );
    ns.api::<FencedLeaseClaim>()
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    let second = wait_for("b granted", WAIT, || ns.granted_token("b")).await;
    assert!(second > token);
    second
}

/// Deletion goes through the finalizer, which writes the ConfigMap it may write (l's last
/// token, `last`), and takes the namespace out of the slot.
async fn deletes_through_the_finalizer(ns: &TestNamespace, last: i64) {
    ns.delete_lease("l").await;
    wait_for("the slot no longer lists the namespace", WAIT, || async {
        slot_listing(ns).await.is_none().then_some(())
    })
    .await;
    let cm = ns
        .api::<k8s_openapi::api::core::v1::ConfigMap>()
        .get(&format!("fenced-lease-tokens.{}", ns.name))
        .await
        .unwrap();
    assert_eq!(
        cm.data.unwrap().get("l").map(String::as_str),
        Some(last.to_string().as_str())
    );
}

#[tokio::test]
async fn operator_works_with_only_its_documented_role() {
    let ns = TestNamespace::new("op-rbac-self").await;
    ns.with_fence_policies().await;
    let subject = bind_the_documented_roles(&ns).await;
    wait_bindings_in_force(&ns, &subject).await;
    assert_no_admission_object_but_the_slots(&ns, &subject);
    let kubeconfig = ns.service_account_kubeconfig("operator");
    let op = OperatorProcess::start_as(
        &ns.name,
        &["--leader-election=true", "--identity", "rbac-test"],
        &kubeconfig,
    );

    a_lease_a_pod_and_two_claims(&ns).await;
    let second = grants_annotates_and_hands_over(&ns).await;
    deletes_through_the_finalizer(&ns, second).await;

    // Events are published (from a queue, so they may trail the grant).
    wait_for("a Granted Event", WAIT, || async {
        let events = ns.api::<Event>().list(&ListParams::default()).await.ok()?;
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Granted"))
            .then_some(())
    })
    .await;
    let log = op.log_text();
    assert!(
        !log.contains("Forbidden") && !log.contains("forbidden"),
        "the operator hit a permission it lacks:\n{log}"
    );
}
