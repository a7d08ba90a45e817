//! `spec.follow` with real pods: two replicas of an unmodified client-go leader election
//! (go/examples/follow/elector, in the demo image) as pods; the leader's pod frozen past its
//! Lease, the other elected by client-go's own rules; thawed, the old leader writes on, sure it
//! leads, and the apiserver refuses every write of it (what `make demo-follow` shows with
//! processes, here with the kubelet's pods and their own tokens).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::node::{env, freeze, kubectl_apply, wait_for};

const NAMESPACE: &str = "follow";

pub async fn a_frozen_leader_of_a_followed_lease_is_refused(client: &Client) {
    kubectl_apply(&format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {NAMESPACE}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: controller, namespace: {NAMESPACE}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: controller, namespace: {NAMESPACE}}}
rules:
  - {{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update]}}
  - {{apiGroups: [""], resources: [configmaps], verbs: [get, patch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: controller, namespace: {NAMESPACE}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: controller}}
subjects: [{{kind: ServiceAccount, name: controller, namespace: {NAMESPACE}}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: work, namespace: {NAMESPACE}}}
---
apiVersion: fencing.dev/v1alpha1
kind: FencedLease
metadata: {{name: fenced, namespace: {NAMESPACE}}}
spec:
  follow: {{lease: elector}}
  fence: {{resources: [{{resource: configmaps}}]}}
"#
    ));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pa = replica(&pods, "pa").await;
    line_after(&pods, "pa", 0, "wrote").await;
    replica(&pods, "pb").await;
    freeze(&pa.uid().expect("uid"), true);
    line_after(&pods, "pb", 0, "leading").await;
    line_after(&pods, "pb", 0, "wrote").await;
    let before = log(&pods, "pa").await.lines().count();
    freeze(&pa.uid().expect("uid"), false);
    let refused = line_after(&pods, "pa", before, "refused").await;
    println!("follow: the thawed leader pa: {refused}");
    // client-go tells it soon that it no longer leads; nothing it wrote meanwhile got through.
    let after: Vec<String> = log(&pods, "pa")
        .await
        .lines()
        .skip(before)
        .map(String::from)
        .collect();
    assert!(
        !after.iter().any(|l| l.starts_with("wrote")),
        "a write of the deposed leader was accepted: {after:?}"
    );
    crate::node::kubectl(&["delete", "namespace", NAMESPACE, "--wait=false"]);
}

/// Pod `name`: the elector, its token the kubelet's, writing ConfigMap `work` every 200 ms while
/// it leads (4 s Lease).
async fn replica(pods: &Api<Pod>, name: &str) -> Pod {
    let pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "serviceAccountName": "controller",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "elector", "image": env("FL_NODE_DEMO_IMAGE"), "imagePullPolicy": "Never",
                "command": ["/elector", "-namespace", NAMESPACE, "-lease", "elector", "-id", name,
                            "-configmap", "work", "-every", "200ms", "-lease-duration", "4s",
                            "-renew-deadline", "3s", "-retry-period", "500ms"],
                "securityContext": {"runAsNonRoot": true, "readOnlyRootFilesystem": true,
                                    "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create replica");
    wait_for(
        &format!("{name} running"),
        Duration::from_secs(60),
        || async {
            let pod = pods.get(name).await.ok()?;
            (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod)
        },
    )
    .await
}

async fn log(pods: &Api<Pod>, name: &str) -> String {
    pods.logs(name, &LogParams::default())
        .await
        .unwrap_or_default()
}

/// The first line of `name`'s log after line `from` that starts with `word`.
async fn line_after(pods: &Api<Pod>, name: &str, from: usize, word: &str) -> String {
    wait_for(
        &format!("{name}: a line '{word}'"),
        Duration::from_secs(60),
        || async {
            let text = log(pods, name).await;
            text.lines()
                .skip(from)
                .find(|l| l.starts_with(word))
                .map(String::from)
        },
    )
    .await
}
