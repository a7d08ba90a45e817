//! The fence as a security reviewer tries it before installing it in a shared cluster (issue
//! 38, invariants I7, I11, I12, I13): against the real control plane, pods authenticating with
//! their own pod-bound ServiceAccount tokens, the operator a real process.
//!
//! A module per promise, in this order (the helpers they share are here):
//!
//! - `bypass`, no way around it: a scale through the `scale` subresource of a Deployment
//!   fenced with a selector, a pod of another namespace naming a local pod in its claim, a `*`
//!   verb standing in for the `override` exemption;
//! - `authors`, no power beyond a lease's author's: a lease fences only what its author may
//!   write, and never what the cluster needs to run (leader elections, Events);
//! - `collateral`: a lease deleted with its finalizer stripped leaves nothing that refuses;
//! - `fail_closed`: a bad selector is refused at admission, and a lease whose fence cannot be
//!   put in place is not granted (a condition, a Warning Event, a metric);
//! - `tokens`: tokens within 2^53 − 1, which every shipped fence compares exactly;
//! - `operator_identity`: the operator's own identity may change only the token annotations of
//!   a pod.
//!
//! Every test checks what a user would notice, each in its own namespace(s); cluster-scoped
//! writes that could remove a shared object are server-side dry runs (admission still runs on
//! them), and the cluster-scoped objects a test creates are deleted when it ends.

use crate::common;

use std::time::{Duration, Instant};

use common::fence::fenced_config_map;
use common::operator::OperatorProcess;
use common::pods::TestPod;
use common::{Beating, TestNamespace, control_plane, repo_root, wait_for};
use fenced_lease::api::{ClaimPhase, FencedLease, FencedLeaseClaim, token_annotation_key};
use fenced_lease_operator::admission::shipped;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::harness::{
    Findings, WAIT, accepted_within, apply, books_held_by, claim_as_pod, config_map,
    create_config_map, create_lease_as, describe, fencing_configmaps, grant, merge_patch, poll,
    refusal, refused_within, wait_allowed, wait_fence_refuses_pb,
};

mod authors;
mod bypass;
mod collateral;
mod fail_closed;
mod operator_identity;
mod tokens;

/// 2^52 and 2^53: the edges of the token bound (2^53 − 1, exact in a double).
const TWO_52: i64 = 1 << 52;
const TWO_53: i64 = 1 << 53;

/// A scale of Deployment `name` to `replicas` through `deployments/scale`, as `kubectl scale`
/// sends it (a merge patch of the Scale).
async fn scale(api: &Api<Deployment>, name: &str, replicas: i32) -> Result<(), kube::Error> {
    let patch = json!({"spec": {"replicas": replicas}});
    api.patch_scale(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(drop)
}

/// Cluster-scoped objects a test created, deleted when it ends (passed or failed).
#[derive(Default)]
struct ClusterObjects(Vec<(&'static str, String)>);

impl ClusterObjects {
    fn add(&mut self, kind: &'static str, name: &str) {
        self.0.push((kind, name.to_string()));
    }
}

impl Drop for ClusterObjects {
    fn drop(&mut self) {
        for (kind, name) in self.0.iter().rev() {
            let _ = control_plane()
                .kubectl_cmd()
                .args(["delete", kind, name, "--ignore-not-found", "--wait=false"])
                .output();
        }
    }
}

/// The documents of deploy/rbac/operator.yaml as the repository has them now.
fn operator_rbac_documents() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(repo_root().join("deploy/rbac/operator.yaml"))
        .expect("read deploy/rbac/operator.yaml");
    serde_saphyr::from_multiple::<serde_json::Value>(&text)
        .expect("parse deploy/rbac/operator.yaml")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn operator_rbac_document(kind: &str, name: &str) -> serde_json::Value {
    operator_rbac_documents()
        .into_iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("deploy/rbac/operator.yaml has no {kind} {name}"))
}

/// Waits until the rules of `role` (a Role or ClusterRole document) are in force for the user
/// of `client` in `ns`: the first verb on the first resource (and name) of each rule.
async fn wait_role_in_force(client: &Client, ns: &str, role: &serde_json::Value) {
    for rule in role["rules"].as_array().into_iter().flatten() {
        let first = |field: &str| rule[field][0].as_str().map(str::to_string);
        let (Some(resource), Some(verb)) = (first("resources"), first("verbs")) else {
            continue; // nonResourceURLs
        };
        let group = first("apiGroups").unwrap_or_default();
        let name = first("resourceNames");
        wait_allowed(client, ns, &verb, &group, &resource, name.as_deref()).await;
    }
}

/// Binds ServiceAccount `ns/sa`, cluster-wide, to the rules of each ClusterRole `roles` of
/// deploy/rbac/operator.yaml (read now, so the rules are the repository's): a private copy of
/// each, named `<role>.<ns>` (the shared ClusterRoles of other tests' runs stay untouched),
/// and a ClusterRoleBinding of the same name. Both are removed with `cleanup`.
fn bind_operator_cluster_roles(
    ns: &TestNamespace,
    sa: &str,
    roles: &[&str],
    cleanup: &mut ClusterObjects,
) {
    for role in roles {
        let mut copy = operator_rbac_document("ClusterRole", role);
        let name = format!("{role}.{}", ns.name);
        copy["metadata"] = json!({"name": name, "labels": {"fencing.dev/test-namespace": ns.name}});
        cleanup.add("clusterrole", &name);
        apply(ns, &copy.to_string());
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": {"fencing.dev/test-namespace": ns.name}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns.name}],
        });
        cleanup.add("clusterrolebinding", &name);
        apply(ns, &binding.to_string());
    }
}

/// The sum of the series of counter `name` whose labels include `label` (`error="fence"`),
/// on the operator's /metrics; `None` when there is none.
async fn metric_with_label(op: &OperatorProcess, name: &str, label: &str) -> Option<f64> {
    let (_, page) = common::http_get(op.http_port().await, "/metrics").await?;
    let values: Vec<f64> = page
        .lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
        .filter(|l| {
            l.split('}')
                .next()
                .is_some_and(|labels| labels.contains(label))
        })
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

// ---- 1 ----
