//! A fence policy the apiserver cannot configure refuses only what its lease fences.
//!
//! While the apiserver cannot resolve a policy's paramKind (after it starts, until it has
//! discovered the FencedLease CRD: kubernetes/kubernetes#124237) it refuses every write the
//! *policy* matches, whatever its bindings say. A safety run saw it: after an apiserver
//! restart, every namespaced write of the cluster (the operators' leader lease among them) was
//! refused for 30 s, because the shared lease rules matched every namespaced kind. That
//! moment cannot be brought about on demand, so this test copies the policies and bindings
//! that fence a lease (the kinds slot that lists its namespace, the binding of labelled
//! objects), with a paramKind no apiserver can resolve, and checks what the copies refuse:
//! the lease's fenced objects, and nothing else.

use crate::common;

use std::time::Duration;

use common::operator::OperatorProcess;
use common::{TestNamespace, wait_for};
use fenced_lease_operator::admission::shipped;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// A dry-run create of `object` in `api`: goes through admission, stores nothing.
async fn try_create<K>(api: &Api<K>, object: serde_json::Value) -> Result<(), String>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).expect("an object");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    api.create(&dry_run, &object)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

fn named(name: &str, labels: serde_json::Value) -> serde_json::Value {
    json!({"metadata": {"name": name, "labels": labels}})
}

/// Copies of `bindings` and their policies, named `prefix-N`, whose policies read their
/// params from a kind that does not exist, matching in `namespace` only.
async fn create_broken_copies(
    client: &kube::Client,
    namespace: &str,
    prefix: &str,
    bindings: &[ValidatingAdmissionPolicyBinding],
) {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let binding_api: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    for (i, binding) in bindings.iter().enumerate() {
        let name = format!("{prefix}-{i}");
        let meta = ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        };
        let original = policies.get(&binding.spec.policy_name).await.unwrap();
        let mut spec = original.spec.unwrap();
        spec.param_kind.as_mut().unwrap().kind = Some("FencedLeaseNowhere".into());
        // Only here: other namespaces' tests are not this one's to disturb.
        spec.match_constraints.as_mut().unwrap().namespace_selector = Some(
            serde_json::from_value(
                json!({"matchLabels": {"kubernetes.io/metadata.name": namespace}}),
            )
            .unwrap(),
        );
        let policy = ValidatingAdmissionPolicy {
            metadata: meta.clone(),
            spec: Some(spec),
            status: None,
        };
        policies
            .create(&PostParams::default(), &policy)
            .await
            .unwrap();
        let mut copy = ValidatingAdmissionPolicyBinding {
            metadata: meta,
            spec: binding.spec.clone(),
        };
        copy.spec.policy_name = name;
        binding_api
            .create(&PostParams::default(), &copy)
            .await
            .unwrap();
    }
}

async fn delete_copies(client: &kube::Client, prefix: &str, n: usize) {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        let _ = bindings.delete(&name, &DeleteParams::default()).await;
        let _ = policies.delete(&name, &DeleteParams::default()).await;
    }
}

/// The kinds slot that lists `ns` for ConfigMaps, as the operator wrote it, and the bindings
/// that fence lease books: the binding of labelled objects, and that slot's.
async fn the_leases_bindings(
    ns: &TestNamespace,
) -> (
    ValidatingAdmissionPolicy,
    Vec<ValidatingAdmissionPolicyBinding>,
) {
    let binding_api: Api<ValidatingAdmissionPolicyBinding> = Api::all(ns.client.clone());
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(ns.client.clone());
    let kept = wait_for("a kinds slot listing the namespace", WAIT, || async {
        for name in shipped::slot_names() {
            let policy = policies.get(&name).await.ok()?;
            if let Ok(Some(a)) = shipped::assignment(&policy)
                && a.kind.resource == "configmaps"
                && a.namespaces.contains(&ns.name)
            {
                return Some(policy);
            }
        }
        None
    })
    .await;
    let mut bindings = vec![];
    for name in [shipped::OBJECTS_BINDING.to_string(), kept.name_any()] {
        bindings.push(binding_api.get(&name).await.unwrap());
    }
    (kept, bindings)
}

/// Waits until the broken copies are in force: the lease's fenced objects (a ConfigMap by
/// kind, a Secret by label) are refused with the configuration error.
async fn wait_broken_copies_in_force(ns: &TestNamespace) {
    let (configmaps, secrets) = (ns.api::<ConfigMap>(), ns.api::<Secret>());
    let labelled = json!({"fencing.dev/lease": "books"});
    wait_for("the broken copies in force", WAIT, || async {
        let kind = try_create(&configmaps, named("fenced-by-kind", json!({}))).await;
        let label = try_create(&secrets, named("fenced-by-label", labelled.clone())).await;
        let broken =
            |r: &Result<(), String>| r.as_ref().is_err_and(|e| e.contains("failed to configure"));
        (broken(&kind) && broken(&label)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_fence_policy_the_apiserver_cannot_configure_refuses_only_what_its_lease_fences() {
    let ns = TestNamespace::new("fence-scope").await;
    let other = TestNamespace::new("fence-scope-other").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let out = ns.kubectl_apply(
        "apiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata:\n  name: books\nspec:\n  fenceObjects: true\n  fence:\n    resources: [{resource: configmaps}]\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (kept, bindings) = the_leases_bindings(&ns).await;
    let prefix = format!("broken-{}", ns.name);
    create_broken_copies(&ns.client, &ns.name, &prefix, &bindings).await;
    wait_broken_copies_in_force(&ns).await;

    // Everything the lease does not fence is written as before. (The shared policy of labelled
    // objects matches every object carrying the lease label, of any lease: those asked to be
    // fenced, and refused while in doubt.)
    let unfenced = [
        (
            "an unlabelled Secret in the lease's namespace",
            try_create(&ns.api::<Secret>(), named("plain", json!({}))).await,
        ),
        (
            "a coordination Lease in the lease's namespace (a leader election)",
            try_create(&ns.api::<Lease>(), named("leader", json!({}))).await,
        ),
        (
            "a ConfigMap in another namespace",
            try_create(&other.api::<ConfigMap>(), named("plain", json!({}))).await,
        ),
    ];
    delete_copies(&ns.client, &prefix, bindings.len()).await;
    for (what, result) in unfenced {
        assert!(
            result.is_ok(),
            "{what} was refused: {}",
            result.unwrap_err()
        );
    }

    // The operator left its slot as it wrote it: the apiserver's defaults are no change.
    let kinds_policy = kept.name_any();
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(ns.client.clone());
    let now = policies.get(&kinds_policy).await.unwrap();
    assert_eq!(
        now.resource_version(),
        kept.resource_version(),
        "the operator rewrote policy {kinds_policy}"
    );
}
