//! No collateral (I12): "nothing the operator leaves behind refuses a write that no existing
//! lease fences". What the run adds for it:
//! - lease [`FENCE_ONLY`] (`d`), which nobody claims: it fences Secrets of the run's namespace
//!   by kind with a selector (only those labelled [`SELECTOR_LABEL`]`=d`), and, like the
//!   others, the objects labelled with it. So a run has both kinds of admission objects the
//!   operator makes (the labelled-objects binding, and a kinds policy with its binding), with
//!   and without a selector. Secrets, not ConfigMaps: the run's own fenced ConfigMaps and the
//!   operator's token records are ConfigMaps of the same namespace, and a kinds policy matches
//!   its whole kind (the selector is a match condition);
//! - objects no lease fences: ConfigMaps and Secrets [`FREE`] of the namespace, with no lease
//!   label and outside `d`'s selector, which the collateral writer patches again and again, as
//!   cluster-admin and as a pod that holds nothing (`collateral`, ServiceAccount `app`);
//! - while the strip-finalizer fault has a lease gone, the same two write what that lease
//!   fenced ([`gone_targets`]): no existing lease fences it then.
//!
//! Each write is recorded as a [`Resource::Unfenced`] write; how an answer is told apart is
//! [`classify`]: the checker counts every refusal as a violation, except the one the apiserver
//! gives while it cannot yet resolve a policy's params kind right after it restarts (see the
//! checker's `collateral`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::TestNamespace;
use crate::history::{Event, Recorder, Resource, now};
use crate::pods::Pods;
use crate::workload;
use crate::writes::config_map_name;
use fenced_lease::api::{LEASE_LABEL, TOKEN_ANNOTATION};

/// The lease nobody claims, which fences Secrets with a selector.
pub const FENCE_ONLY: &str = "d";
/// The label `d`'s selector asks for.
pub const SELECTOR_LABEL: &str = "jepsen.fencing.dev/fenced-by";
/// The objects no lease fences (one ConfigMap and one Secret of each name).
pub const FREE: [&str; 2] = ["jepsen-free-0", "jepsen-free-1"];
/// The Secret `d`'s selector selects (written only while `d` is gone).
pub const SELECTED: &str = "jepsen-d-selected";
/// The annotation the collateral writes set.
const ANNOTATION: &str = "jepsen.fencing.dev/collateral";
/// The pod that holds nothing.
const POD: &str = "collateral";
/// One write in this long.
const EVERY: Duration = Duration::from_millis(250);
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// `spec.fence` of lease [`FENCE_ONLY`].
pub fn fence_only_fence() -> serde_json::Value {
    json!({
        "resources": [{"group": "", "resource": "secrets"}],
        "selector": {"matchLabels": {SELECTOR_LABEL: FENCE_ONLY}},
    })
}

/// An object a collateral write goes to.
#[derive(Clone, Debug)]
pub struct Object {
    resource: ApiResource,
    name: String,
}

impl Object {
    fn new(group: &str, kind: &str, plural: &str, name: &str) -> Self {
        let api_version = if group.is_empty() {
            "v1".to_string()
        } else {
            format!("{group}/v1")
        };
        Object {
            resource: ApiResource {
                group: group.into(),
                version: "v1".into(),
                api_version,
                kind: kind.into(),
                plural: plural.into(),
            },
            name: name.into(),
        }
    }

    fn config_map(name: &str) -> Self {
        Object::new("", "ConfigMap", "configmaps", name)
    }

    fn secret(name: &str) -> Self {
        Object::new("", "Secret", "secrets", name)
    }

    /// `plural/name`, the key of its writes in the history.
    pub fn key(&self) -> String {
        format!("{}/{}", self.resource.plural, self.name)
    }
}

/// What lease `lease` fences, written while it is gone: its labelled ConfigMap and the object
/// of its kind (`d`: the Secret its selector selects).
pub fn gone_targets(lease: &str) -> Vec<Object> {
    let by_kind = if lease == FENCE_ONLY {
        Object::secret(SELECTED)
    } else {
        let kind = workload::kind_of(lease);
        Object::new(
            "apps",
            kind.kind,
            kind.plural,
            &workload::object_name(lease),
        )
    };
    vec![Object::config_map(&config_map_name(lease)), by_kind]
}

/// The two writers: cluster-admin, and a pod that holds no lease.
#[derive(Clone)]
pub struct Collateral {
    namespace: String,
    admin: kube::Client,
    pod: kube::Client,
    /// Numbers the writes [`Self::write_gone`] makes (in the nemesis's history).
    gone_writes: Arc<AtomicU64>,
}

/// How one collateral write ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Accepted,
    /// The apiserver answered and did not apply it: `<code> <reason>: <message>`.
    Refused(String),
    /// No answer, or the apiserver was not there to answer (see [`classify`]).
    Failed(String),
}

/// Tells a refusal from an unavailable apiserver. Refused: any status the apiserver answers
/// with, except 404 and 409 (the object is not there: not applied, not refused), and 429,
/// 500, 502, 503 and 504 whose message does not come from admission (`denied request`,
/// `ValidatingAdmissionPolicy`, `failed to configure`, `admission webhook`): those are the
/// apiserver or etcd not (yet) serving (`the server is currently unable to handle the
/// request`, `etcdserver: request timed out`, `Timeout: ...`). A 403 of the authorizer
/// (RBAC's `cannot <verb> resource`, not admission's) is a failure as well: nothing fenced-lease
/// installs or leaves behind is an RBAC rule. No answer at all (connection refused or reset, a
/// timeout on our side) is a failure too.
pub fn classify(error: &kube::Error) -> Answer {
    match error {
        kube::Error::Api(status) => {
            let text = shorten(&format!(
                "{} {}: {}",
                status.code, status.reason, status.message
            ));
            let m = &status.message;
            let from_admission = [
                "denied request",
                "ValidatingAdmissionPolicy",
                "failed to configure",
                "admission webhook",
            ]
            .iter()
            .any(|w| m.contains(w));
            let unavailable = matches!(status.code, 429 | 500 | 502 | 503 | 504) && !from_admission;
            // RBAC's own 403 (`User "…" cannot patch resource …`), seen while a restarted
            // apiserver's authorizer has not loaded its roles yet: fenced-lease writes no RBAC.
            let authorizer = status.code == 403 && !from_admission && m.contains(" cannot ");
            if status.code == 404 || status.code == 409 || unavailable || authorizer {
                Answer::Failed(text)
            } else {
                Answer::Refused(text)
            }
        }
        other => Answer::Failed(other.to_string()),
    }
}

/// `text`, its middle cut out if it is long (a policy's message quotes its whole expression,
/// and says what went wrong at the end).
fn shorten(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= 700 {
        return text.to_string();
    }
    let head: String = chars[..400].iter().collect();
    let tail: String = chars[chars.len() - 250..].iter().collect();
    format!("{head} [...] {tail}")
}

/// Tallies of collateral writes, for a fault's record.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    pub accepted: usize,
    pub refused: usize,
    pub failed: usize,
}

impl Collateral {
    /// Creates the objects no lease fences, `d`'s selected Secret and labelled ConfigMap (all
    /// before lease `d`, as cluster-admin) and the pod that holds nothing.
    pub async fn setup(ns: &TestNamespace, pods: &Pods) -> Collateral {
        let cms = ns.api::<ConfigMap>();
        let secrets = ns.api::<Secret>();
        let pp = PostParams::default();
        let meta = |name: &str, labels: BTreeMap<String, String>| ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(ANNOTATION.into(), "setup".into())])),
            ..Default::default()
        };
        for name in FREE {
            let cm = ConfigMap {
                metadata: meta(name, BTreeMap::new()),
                ..Default::default()
            };
            cms.create(&pp, &cm).await.expect("create a free ConfigMap");
            let secret = Secret {
                metadata: meta(name, BTreeMap::new()),
                ..Default::default()
            };
            secrets
                .create(&pp, &secret)
                .await
                .expect("create a free Secret");
        }
        let selected = Secret {
            metadata: meta(
                SELECTED,
                BTreeMap::from([(SELECTOR_LABEL.into(), FENCE_ONLY.into())]),
            ),
            ..Default::default()
        };
        secrets
            .create(&pp, &selected)
            .await
            .expect("create the Secret lease d selects");
        let mut labelled = meta(
            &config_map_name(FENCE_ONLY),
            BTreeMap::from([(LEASE_LABEL.into(), FENCE_ONLY.into())]),
        );
        labelled
            .annotations
            .get_or_insert_default()
            .insert(TOKEN_ANNOTATION.into(), "0".into());
        cms.create(
            &pp,
            &ConfigMap {
                metadata: labelled,
                ..Default::default()
            },
        )
        .await
        .expect("create the ConfigMap labelled with lease d");
        let pod = pods
            .create(POD, None)
            .await
            .expect("the pod that holds nothing");
        let pod = crate::common::client_from_kubeconfig(&pod.kubeconfig).await;
        Collateral {
            namespace: ns.name.clone(),
            admin: ns.client.clone(),
            pod,
            gone_writes: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Writes `object` once (a merge patch of one annotation), as cluster-admin or as the pod
    /// that holds nothing, recording the attempt and its answer; `why` says what makes it a
    /// write no lease fences.
    pub async fn write(
        &self,
        rec: &Recorder,
        n: u64,
        object: &Object,
        as_pod: bool,
        why: &str,
    ) -> Answer {
        let id = format!("{}#{n}", rec.process());
        let who = if as_pod {
            format!("as pod {POD}, which holds no lease")
        } else {
            "as cluster-admin".to_string()
        };
        rec.record(Event::WriteAttempt {
            id: id.clone(),
            resource: Resource::Unfenced,
            key: object.key(),
            lease: String::new(),
            token: 0,
            how: Some(format!("merge patch {who}; {why}")),
        });
        let client = if as_pod { &self.pod } else { &self.admin };
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &self.namespace, &object.resource);
        let patch = json!({"metadata": {"annotations": {ANNOTATION: id}}});
        let pp = PatchParams::default();
        let patch = Patch::Merge(&patch);
        let sent = api.patch(&object.name, &pp, &patch);
        let answer = match tokio::time::timeout(WRITE_TIMEOUT, sent).await {
            Ok(Ok(_)) => Answer::Accepted,
            Ok(Err(e)) => classify(&e),
            Err(_) => Answer::Failed(format!("no answer within {WRITE_TIMEOUT:?}")),
        };
        let t = now();
        rec.record_at(
            t,
            match answer.clone() {
                Answer::Accepted => Event::WriteAccepted { id, seq: None },
                Answer::Refused(refusal) => Event::WriteRefused {
                    id,
                    highest: 0,
                    not_holder: None,
                    refusal: Some(refusal),
                },
                Answer::Failed(error) => Event::WriteFailed { id, error },
            },
        );
        answer
    }

    /// The collateral writer: the objects no lease fences, each written by both writers in
    /// turn, one write every [`EVERY`], until `stopping`.
    pub fn spawn(
        &self,
        rec: Arc<Recorder>,
        stopping: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let objects: Vec<Object> = FREE
                .iter()
                .flat_map(|name| [Object::config_map(name), Object::secret(name)])
                .collect();
            let mut n = 0u64;
            while !stopping.load(Ordering::SeqCst) {
                let object = &objects[(n % objects.len() as u64) as usize];
                let as_pod = (n / objects.len() as u64) % 2 == 1;
                this.write(
                    &rec,
                    n,
                    object,
                    as_pod,
                    "no lease label, outside every lease's kinds and selector",
                )
                .await;
                n += 1;
                tokio::time::sleep(EVERY).await;
            }
        })
    }

    /// While lease `lease` is gone: what it fenced, written `rounds` times by both writers.
    pub async fn write_gone(&self, rec: &Recorder, lease: &str, rounds: usize) -> Tally {
        let mut tally = Tally::default();
        let why = format!("lease {lease} (which fenced it) is gone");
        for _ in 0..rounds {
            for object in gone_targets(lease) {
                for as_pod in [false, true] {
                    let n = self.gone_writes.fetch_add(1, Ordering::Relaxed);
                    match self.write(rec, n, &object, as_pod, &why).await {
                        Answer::Accepted => tally.accepted += 1,
                        Answer::Refused(_) => tally.refused += 1,
                        Answer::Failed(_) => tally.failed += 1,
                    }
                }
            }
            tokio::time::sleep(EVERY).await;
        }
        tally
    }
}
