//! Pods and the identities they carry: a ServiceAccount token bound to a pod, as every pod
//! mounts, so that the apiserver sees the writer's pod name and UID (`userInfo.extra`). There
//! is no kubelet: pods stay Pending, which is all the identity needs.

use std::path::PathBuf;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Client;
use kube::api::PostParams;
use kube::config::AuthInfo;
use serde_json::json;

use super::cli::both;
use super::{TestNamespace, control_plane};

/// What the pods of ServiceAccount `app` may do besides holding leases: write ConfigMaps and
/// Deployments, their status and scale.
const WRITER_ROLE: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: writer}
rules:
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["*"]
  - apiGroups: ["apps"]
    resources: ["deployments", "deployments/status", "deployments/scale"]
    verbs: ["*"]
"#;

/// A pod of the test namespace and the ServiceAccount it runs as.
#[derive(Clone, Debug)]
pub struct TestPod {
    pub name: String,
    pub uid: String,
    pub service_account: String,
}

/// A TokenRequest for `seconds`, bound to the pod `(name, uid)` when given.
pub fn token_request(pod: Option<(&str, &str)>, seconds: i64) -> TokenRequest {
    TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(seconds),
            bound_object_ref: pod.map(|(name, uid)| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

impl TestNamespace {
    /// ServiceAccount `app` with the holder Role and [`WRITER_ROLE`], and pods `names` running
    /// as it.
    pub async fn app_pods(&self, names: &[&str]) -> Vec<TestPod> {
        self.holder_service_account_kubeconfig("app", true).await;
        for manifest in [
            WRITER_ROLE.to_string(),
            format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: app-writer}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: writer}}\nsubjects: [{{kind: ServiceAccount, name: app, namespace: {}}}]\n",
                self.name
            ),
        ] {
            let out = self.kubectl_apply(&manifest);
            assert!(out.status.success(), "{}", both(&out));
        }
        let mut pods = Vec::new();
        for name in names {
            pods.push(self.create_pod_as(name, "app").await);
        }
        pods
    }

    /// Creates ServiceAccount `sa` unless it exists.
    pub async fn create_service_account(&self, sa: &str) {
        let account: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": sa}})).unwrap();
        match self
            .api::<ServiceAccount>()
            .create(&PostParams::default(), &account)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("create ServiceAccount {sa}: {e}"),
        }
    }

    /// Creates pod `name` running as ServiceAccount `sa` (created if missing).
    pub async fn create_pod_as(&self, name: &str, sa: &str) -> TestPod {
        self.create_service_account(sa).await;
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "serviceAccountName": sa,
                "containers": [{"name": "main", "image": "example.invalid/holder:1"}],
            },
        }))
        .unwrap();
        let created = self
            .api::<Pod>()
            .create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
        TestPod {
            name: name.into(),
            uid: created.metadata.uid.expect("uid"),
            service_account: sa.into(),
        }
    }

    /// A token of ServiceAccount `sa`, bound to `pod` when given (the token a pod mounts).
    pub async fn service_account_token(&self, sa: &str, pod: Option<&TestPod>) -> String {
        self.create_service_account(sa).await;
        let request = token_request(pod.map(|pod| (pod.name.as_str(), pod.uid.as_str())), 3600);
        let issued: TokenRequest = self
            .api::<ServiceAccount>()
            .create_subresource("token", sa, &PostParams::default(), &request)
            .await
            .expect("TokenRequest");
        issued
            .status
            .and_then(|s| s.token)
            .expect("TokenRequest status with a token")
    }

    /// A client that authenticates as ServiceAccount `sa`, with a token bound to `pod` when
    /// given.
    pub async fn client_as(&self, sa: &str, pod: Option<&TestPod>) -> Client {
        let token = self.service_account_token(sa, pod).await;
        let mut config = control_plane().admin_config().await;
        config.auth_info =
            serde_json::from_value::<AuthInfo>(json!({ "token": token })).expect("auth info");
        Client::try_from(config).expect("service account client")
    }

    /// A client that authenticates as `pod`, with the token it would mount.
    pub async fn client_as_pod(&self, pod: &TestPod) -> Client {
        self.client_as(&pod.service_account, Some(pod)).await
    }

    /// A kubeconfig that authenticates as `pod` with the token it would mount (for kubectl and
    /// kubectl-fence run as that pod).
    pub async fn kubeconfig_as_pod(&self, pod: &TestPod) -> PathBuf {
        let token = self
            .service_account_token(&pod.service_account, Some(pod))
            .await;
        self.kubeconfig_with_token(&token, &format!("pod-{}", pod.name))
    }
}
