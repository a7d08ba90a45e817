//! The writer pods of the I11 windows: Pending pods (no kubelet) of ServiceAccount `writer`,
//! and clients with tokens bound to them, as a pod mounts. A probe is a dry-run create (which
//! admission checks like a real one): refused by an admission policy, or accepted.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Config;
use kube::api::{Api, PostParams};
use kube::config::AuthInfo;
use serde_json::json;

use crate::common::{Res, fail};

/// `fut` within `timeout`; its error or the timeout named by `what`.
async fn within<T, E: Display>(
    timeout: Duration,
    what: impl Display,
    fut: impl Future<Output = Result<T, E>>,
) -> Res<T> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => fail(format!("{what}: {e}")),
        Err(_) => fail(format!("{what}: no answer within {timeout:?}")),
    }
}

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
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let mut writers = vec![];
    for (name, uid) in pods {
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(name.clone()),
                    uid: Some(uid.clone()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pp = PostParams::default();
        let issued: TokenRequest = within(
            timeout,
            format!("token for pod {name}"),
            accounts.create_subresource("token", "writer", &pp, &request),
        )
        .await?;
        let token = issued
            .status
            .map(|s| s.token)
            .ok_or("a TokenRequest without a token")?;
        let mut config = Config::infer().await?;
        config.auth_info = serde_json::from_value::<AuthInfo>(json!({ "token": token }))?;
        writers.push(WriterPod {
            name: name.clone(),
            configmaps: Api::namespaced(fenced_lease::client::client(config)?, ns),
            probe: probe.clone(),
            timeout,
        });
    }
    Ok(writers)
}

impl WriterPod {
    /// A dry-run create of the probe as this pod: whether an admission policy refused it.
    pub async fn refused(&self) -> Res<bool> {
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
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
