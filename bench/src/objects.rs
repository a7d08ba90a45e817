//! The objects the programs create (leases, claims, pods never run) and a holder's one write,
//! its heartbeat.

use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

pub fn lease(name: &str, duration_seconds: u32) -> FencedLease {
    serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": name},
        "spec": {"leaseDurationSeconds": duration_seconds, "annotateHolderPod": false}
    }))
    .expect("a valid FencedLease")
}

pub fn claim(name: &str, lease: &str) -> FencedLeaseClaim {
    serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
        "metadata": {"name": name},
        "spec": {"leaseName": lease, "holderIdentity": name}
    }))
    .expect("a valid FencedLeaseClaim")
}

/// A pod with a Deployment's labels and an annotation, never run here. No owner reference:
/// the garbage collector would delete a pod whose owner does not exist.
pub fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"app": "bench-holder", "pod-template-hash": "5d9f7c8b6"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-30T00:00:00Z"}
        },
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .expect("a valid Pod")
}

/// Sets the heartbeat (`spec.renewTime`) of claim `name`: the holder's one write.
pub async fn beat(claims: &Api<FencedLeaseClaim>, name: &str) -> kube::Result<()> {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let patch = json!({"spec": {"renewTime": now}});
    claims
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// A dry-run create: admission checks it as it checks a real one, and nothing is stored.
pub fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}
