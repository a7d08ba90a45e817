//! The writes a stale holder's pod really makes to what its lease fences by kind, none of them
//! stamped with a token, so that only the writer's identity (I11) can refuse them: a status
//! update (merge and JSON patches), a scale, a metadata patch (merge, strategic merge,
//! server-side apply), a delete and a create — some through the Rust client, some through
//! plain `kubectl`, all as the holder's own pod (its kubeconfig carries a token bound to it).
//!
//! Each lease fences one workload kind of the run's namespace as a whole (`spec.fence` with no
//! selector, since a `scale` carries no labels): lease `a` Deployments, `b` StatefulSets, `c`
//! ReplicaSets, `f` DaemonSets (written by its client-go leaders, `go/internal/cmd/jepsenholder`
//! in `-mode=follow`; a DaemonSet has no scale). No controller acts on them (the control plane runs none), so their replicas
//! are numbers only. The object `jepsen-<lease>` always exists; `jepsen-<lease>-scratch` is
//! deleted and created again.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use fenced_lease::fence;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

/// A workload kind a lease fences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    pub kind: &'static str,
    pub plural: &'static str,
}

/// The kind lease `lease` fences (see the module's header).
pub fn kind_of(lease: &str) -> Kind {
    match lease {
        "a" => Kind {
            kind: "Deployment",
            plural: "deployments",
        },
        "b" => Kind {
            kind: "StatefulSet",
            plural: "statefulsets",
        },
        "f" => Kind {
            kind: "DaemonSet",
            plural: "daemonsets",
        },
        _ => Kind {
            kind: "ReplicaSet",
            plural: "replicasets",
        },
    }
}

/// `spec.fence` of lease `lease`: its workload kind, the whole kind.
pub fn fence_spec(lease: &str) -> serde_json::Value {
    json!({"resources": [{"group": "apps", "resource": kind_of(lease).plural}]})
}

/// The object of lease `lease`'s kind that always exists, and the one deleted and created.
pub fn object_name(lease: &str) -> String {
    format!("jepsen-{lease}")
}

pub fn scratch_name(lease: &str) -> String {
    format!("jepsen-{lease}-scratch")
}

/// The API of lease `lease`'s workload kind in `namespace`.
pub fn api(client: kube::Client, namespace: &str, lease: &str) -> Api<DynamicObject> {
    let kind = kind_of(lease);
    let resource = ApiResource {
        group: "apps".into(),
        version: "v1".into(),
        api_version: "apps/v1".into(),
        kind: kind.kind.into(),
        plural: kind.plural.into(),
    };
    Api::namespaced_with(client, namespace, &resource)
}

/// What the writers' pods may do to the workloads (besides holding leases and writing the
/// labelled ConfigMaps), to Secrets (the collateral writer's, [`crate::collateral`]), and to
/// coordination Leases (the elections of lease `f`'s client-go leaders).
pub const ROLE: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: jepsen-workloads}
rules:
  - apiGroups: ["apps"]
    resources: ["deployments", "statefulsets", "replicasets", "deployments/status",
                "statefulsets/status", "replicasets/status", "deployments/scale",
                "statefulsets/scale", "replicasets/scale", "daemonsets", "daemonsets/status"]
    verbs: ["*"]
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["get", "create", "update"]
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["*"]
"#;

/// A workload object named `name` of lease `lease`'s kind, with no replicas.
pub fn manifest(lease: &str, name: &str) -> serde_json::Value {
    let kind = kind_of(lease);
    let mut spec = json!({
        "replicas": 0,
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "main", "image": "example.invalid/jepsen:1"}]},
        },
    });
    match kind.kind {
        "StatefulSet" => spec["serviceName"] = json!(name),
        "DaemonSet" => {
            spec.as_object_mut()
                .expect("a spec object")
                .remove("replicas");
        }
        _ => {}
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": kind.kind,
        "metadata": {"name": name, "annotations": {WRITE_ANNOTATION: "setup"}},
        "spec": spec,
    })
}

/// The annotation a metadata patch sets: the write's id.
const WRITE_ANNOTATION: &str = "jepsen.fencing.dev/write";

/// One kind of write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    /// The status subresource: a merge patch (client), a JSON patch (`kubectl`).
    Status,
    Scale,
    MergePatch,
    StrategicPatch,
    Apply,
    Delete,
    Create,
}

/// The order a writer goes through: every verb, one write in eight through `kubectl` (a
/// process start per write is dear on a small machine), each delete followed by a create.
const CYCLE: [(Verb, bool); 24] = [
    (Verb::Status, false),
    (Verb::Scale, false),
    (Verb::StrategicPatch, false),
    (Verb::Delete, true),
    (Verb::Create, false),
    (Verb::Apply, false),
    (Verb::MergePatch, false),
    (Verb::Status, false),
    (Verb::Scale, false),
    (Verb::StrategicPatch, false),
    (Verb::Scale, true),
    (Verb::Delete, false),
    (Verb::Create, false),
    (Verb::Apply, false),
    (Verb::MergePatch, false),
    (Verb::Scale, false),
    (Verb::Status, false),
    (Verb::StrategicPatch, false),
    (Verb::Status, true),
    (Verb::Delete, false),
    (Verb::Create, false),
    (Verb::Apply, false),
    (Verb::MergePatch, false),
    (Verb::Scale, false),
];

/// Is write number `n` of the cycle made through `kubectl`?
pub fn by_kubectl(n: u64) -> bool {
    CYCLE[(n % CYCLE.len() as u64) as usize].1
}

/// How one write ended (as [`crate::worker`] records it).
pub enum Answer {
    Accepted,
    /// Refused by a fence: the apiserver's message, and the token it names if any.
    Refused(String, i64),
    Failed(String),
}

/// The workload writes of one process.
pub struct Writer {
    api: Api<DynamicObject>,
    kind: Kind,
    namespace: String,
    kubeconfig: PathBuf,
    kubectl: PathBuf,
    process: String,
}

impl Writer {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        lease: &str,
        kubeconfig: &Path,
        kubectl: &Path,
        process: &str,
    ) -> Self {
        Writer {
            api: api(client, namespace, lease),
            kind: kind_of(lease),
            namespace: namespace.into(),
            kubeconfig: kubeconfig.into(),
            kubectl: kubectl.into(),
            process: process.into(),
        }
    }

    /// The write number `n` of the cycle: the key (`kind/name[/subresource]`) and how it is
    /// made, for the record, before it is sent.
    pub fn describe(&self, lease: &str, n: u64) -> (String, String) {
        let (verb, kubectl) = CYCLE[(n % CYCLE.len() as u64) as usize];
        let name = match verb {
            Verb::Delete | Verb::Create => scratch_name(lease),
            _ => object_name(lease),
        };
        let sub = match verb {
            Verb::Status => "/status",
            Verb::Scale => "/scale",
            _ => "",
        };
        let how = format!(
            "{} ({})",
            format!("{verb:?}").to_lowercase(),
            if kubectl { "kubectl" } else { "client" }
        );
        (format!("{}/{name}{sub}", self.kind.plural), how)
    }

    /// Makes write number `n` of the cycle, with `id` as what it writes.
    pub async fn send(&self, lease: &str, n: u64, id: &str) -> Answer {
        let (verb, kubectl) = CYCLE[(n % CYCLE.len() as u64) as usize];
        let value = id_number(id);
        if kubectl {
            return self.kubectl(verb, lease, id, value).await;
        }
        let api = &self.api;
        let name = object_name(lease);
        let pp = PatchParams::default();
        let result = match verb {
            Verb::Status => {
                let patch = json!({"status": {"observedGeneration": value}});
                api.patch_status(&name, &pp, &Patch::Merge(&patch))
                    .await
                    .map(drop)
            }
            Verb::Scale => {
                let patch = json!({"spec": {"replicas": value % 5}});
                api.patch_scale(&name, &pp, &Patch::Merge(&patch))
                    .await
                    .map(drop)
            }
            Verb::MergePatch => {
                let patch = json!({"metadata": {"annotations": {WRITE_ANNOTATION: id}}});
                api.patch(&name, &pp, &Patch::Merge(&patch)).await.map(drop)
            }
            Verb::StrategicPatch => {
                let patch = json!({"metadata": {"annotations": {WRITE_ANNOTATION: id}}});
                api.patch(&name, &pp, &Patch::Strategic(&patch))
                    .await
                    .map(drop)
            }
            Verb::Apply => {
                let patch = json!({
                    "apiVersion": "apps/v1",
                    "kind": self.kind.kind,
                    "metadata": {"name": name, "annotations": {WRITE_ANNOTATION: id}},
                });
                let pp = PatchParams::apply(&self.process).force();
                api.patch(&name, &pp, &Patch::Apply(&patch)).await.map(drop)
            }
            Verb::Delete => api
                .delete(&scratch_name(lease), &DeleteParams::default())
                .await
                .map(drop),
            Verb::Create => {
                let object: DynamicObject =
                    serde_json::from_value(manifest(lease, &scratch_name(lease)))
                        .expect("a workload object");
                api.create(&PostParams::default(), &object).await.map(drop)
            }
        };
        match result {
            Ok(()) => Answer::Accepted,
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                Answer::Failed(format!("{} ({}): not applied", e.message, e.code))
            }
            Err(e) => match fence::Error::from(e) {
                fence::Error::NotHolder(what) => Answer::Refused(what, 0),
                fence::Error::Fenced { highest, .. } => {
                    Answer::Refused(format!("a token below {highest}"), highest)
                }
                other => Answer::Failed(other.to_string()),
            },
        }
    }

    async fn kubectl(&self, verb: Verb, lease: &str, id: &str, value: u64) -> Answer {
        let kind = kind_of(lease);
        let (object, scratch) = (object_name(lease), scratch_name(lease));
        let args: Vec<String> = match verb {
            Verb::Scale => vec![
                "scale".into(),
                format!("{}/{object}", kind.plural),
                format!("--replicas={}", value % 5),
            ],
            Verb::Status => vec![
                "patch".into(),
                kind.plural.into(),
                object,
                "--subresource=status".into(),
                "--type=json".into(),
                "-p".into(),
                json!([{"op": "add", "path": "/status/observedGeneration", "value": value}])
                    .to_string(),
            ],
            Verb::Delete => vec![
                "delete".into(),
                kind.plural.into(),
                scratch,
                "--wait=false".into(),
            ],
            _ => vec![
                "annotate".into(),
                kind.plural.into(),
                object,
                "--overwrite".into(),
                format!("{WRITE_ANNOTATION}={id}"),
            ],
        };
        let out = tokio::process::Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--request-timeout=5s", "-n", &self.namespace])
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output()
            .await;
        match out {
            Ok(out) if out.status.success() => Answer::Accepted,
            Ok(out) => {
                let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
                match stderr.split_once("fenced: ") {
                    Some((_, what)) if what.contains(" does not hold FencedLease ") => {
                        Answer::Refused(what.to_string(), 0)
                    }
                    Some((_, what)) => Answer::Refused(what.to_string(), 0),
                    None if stderr.contains("(NotFound)") || stderr.contains("(AlreadyExists)") => {
                        Answer::Failed(format!("{stderr}: not applied"))
                    }
                    None => Answer::Failed(format!("kubectl {}: {stderr}", out.status)),
                }
            }
            Err(e) => Answer::Failed(format!("cannot run kubectl: {e}")),
        }
    }
}

/// A number that differs from write to write (the write counter in `id`, `<process>#<n>`).
fn id_number(id: &str) -> u64 {
    id.rsplit('#')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
        + 1
}
