//! The writer pods of the I11 windows: Pending pods (no kubelet) of ServiceAccount `writer`,
//! and clients with tokens bound to them, as a pod mounts ([`crate::pod_client`]). A probe is a
//! dry-run create (which admission checks like a real one): refused by an admission policy, or
//! accepted; [`until`] probes until the answer changes.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::cluster::within;
use crate::objects::dry_run;
use crate::pod_client::{PodRef, pod_client};
use crate::{Res, fail};

/// The ServiceAccount the writer pods run as.
pub const WRITER_ACCOUNT: &str = "writer";

/// ServiceAccount `writer` may create ConfigMaps in `ns`; pods `writer-a` and `writer-b` run as
/// it (Pending: no kubelet). Their names and UIDs.
pub async fn writer_pods(
    client: &kube::Client,
    ns: &str,
    timeout: Duration,
) -> Res<Vec<(String, String)>> {
    let pp = PostParams::default();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let account = serde_json::from_value(json!({"metadata": {"name": "writer"}}))?;
    let what = "create ServiceAccount writer";
    within(timeout, what, accounts.create(&pp, &account)).await?;
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "writer"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}],
    }))?;
    let roles = Api::<Role>::namespaced(client.clone(), ns);
    within(timeout, "create Role writer", roles.create(&pp, &role)).await?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "writer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "writer"},
        "subjects": [{"kind": "ServiceAccount", "name": "writer", "namespace": ns}],
    }))?;
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), ns);
    let what = "create RoleBinding writer";
    within(timeout, what, bindings.create(&pp, &binding)).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut made = vec![];
    for name in ["writer-a", "writer-b"] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "serviceAccountName": "writer",
                "containers": [{"name": "main", "image": "example.invalid/writer:1"}],
            },
        }))?;
        let what = format!("create pod {name}");
        let uid = within(timeout, what, pods.create(&pp, &pod))
            .await?
            .metadata
            .uid
            .ok_or("a pod without a UID")?;
        made.push((name.to_string(), uid));
    }
    Ok(made)
}

/// A pod the bench writes as: a client with a token bound to it, as the pod mounts.
pub struct WriterPod {
    pub name: String,
    configmaps: Api<ConfigMap>,
    /// What it writes (dry run).
    probe: ConfigMap,
    timeout: Duration,
}

/// Fresh tokens (an hour) for the writer pods, and a client for each, writing `probe`.
pub async fn writer_clients(
    client: &kube::Client,
    ns: &str,
    pods: &[(String, String)],
    probe: ConfigMap,
    timeout: Duration,
) -> Res<Vec<WriterPod>> {
    let mut writers = vec![];
    for (name, uid) in pods {
        let pod = PodRef {
            namespace: ns,
            name,
            uid,
            service_account: WRITER_ACCOUNT,
        };
        writers.push(WriterPod {
            name: name.clone(),
            configmaps: Api::namespaced(pod_client(client, pod, timeout).await?, ns),
            probe: probe.clone(),
            timeout,
        });
    }
    Ok(writers)
}

impl WriterPod {
    /// A dry-run create of the probe as this pod: whether an admission policy refused it.
    pub async fn refused(&self) -> Res<bool> {
        let dry_run = dry_run();
        let create = self.configmaps.create(&dry_run, &self.probe);
        match tokio::time::timeout(self.timeout, create).await {
            Ok(Ok(_)) => Ok(false),
            // Refused by an admission policy (not by RBAC, which says "cannot create").
            Ok(Err(kube::Error::Api(s)))
                if s.code == 403
                    && (s.message.contains("ValidatingAdmissionPolicy")
                        || s.message.contains("does not hold")) =>
            {
                Ok(true)
            }
            Ok(Err(e)) => fail(format!("a write by pod {}: {e}", self.name)),
            Err(_) => fail(format!(
                "a write by pod {}: no answer within {:?}",
                self.name, self.timeout
            )),
        }
    }
}

/// Probes with `check` until it answers true: how long after `started` that answer came, and
/// how many probes it took. Fails with `gave_up(probes)` once `timeout` has passed.
pub async fn until<F, Fut>(
    started: Instant,
    timeout: Duration,
    mut check: F,
    gave_up: impl FnOnce(usize) -> String,
) -> Res<(Duration, usize)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Res<bool>>,
{
    let mut probes = 0;
    loop {
        probes += 1;
        if check().await? {
            return Ok((started.elapsed(), probes));
        }
        if started.elapsed() > timeout {
            return fail(gave_up(probes));
        }
    }
}
