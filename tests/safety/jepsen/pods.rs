//! The pods the holder processes run as. Each process (each incarnation of a slot) gets a pod
//! of its own and a kubeconfig with a ServiceAccount token bound to that pod, the token a pod
//! mounts: the apiserver then sees the writer's pod (`userInfo.extra`), the claim ownership
//! policy lets the claim name it, and the lease status records its UID (`holder.podUid`),
//! which is what the identity rule (I11) compares. There is no kubelet: pods stay Pending.

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::config::{AuthInfo, Kubeconfig};
use serde_json::json;

use crate::common::TestNamespace;
use crate::common::cli::both;
use crate::common::pods::token_request;
use crate::common::proxy::Proxy;
use crate::workload;

/// The ServiceAccount the pods run as (`TestNamespace::app_pods` sets up its roles).
const SERVICE_ACCOUNT: &str = "app";
/// A token outlives any run (a process can live as long as a soak).
const TOKEN_SECONDS: i64 = 24 * 3600;

/// Makes the pods and their kubeconfigs.
#[derive(Clone)]
pub struct Pods {
    client: kube::Client,
    namespace: String,
    admin_kubeconfig: PathBuf,
    dir: PathBuf,
}

/// A pod made for one process, and the kubeconfig that authenticates as it.
pub struct HolderPod {
    pub name: String,
    pub uid: String,
    pub kubeconfig: PathBuf,
}

impl Pods {
    /// ServiceAccount `app`, allowed to hold leases and to write the labelled ConfigMaps and
    /// the workloads; kubeconfigs go to `dir`.
    pub async fn setup(ns: &TestNamespace, dir: &Path) -> Pods {
        ns.app_pods(&[]).await;
        let binding = format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: app-workloads}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: jepsen-workloads}}\nsubjects: [{{kind: ServiceAccount, name: {SERVICE_ACCOUNT}, namespace: {}}}]\n",
            ns.name
        );
        for manifest in [workload::ROLE, &binding] {
            let out = ns.kubectl_apply(manifest);
            assert!(out.status.success(), "{}", both(&out));
        }
        std::fs::create_dir_all(dir).expect("kubeconfig dir");
        Pods {
            client: ns.client.clone(),
            namespace: ns.name.clone(),
            admin_kubeconfig: ns.admin_kubeconfig().to_path_buf(),
            dir: dir.into(),
        }
    }

    /// Creates pod `name` (or finds it, made by an attempt that failed later) and writes a
    /// kubeconfig that authenticates as it, through `proxy` when given.
    pub async fn create(&self, name: &str, proxy: Option<&Proxy>) -> Result<HolderPod, String> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "serviceAccountName": SERVICE_ACCOUNT,
                "containers": [{"name": "main", "image": "example.invalid/holder:1"}],
            },
        }))
        .expect("a pod");
        let created = match pods.create(&PostParams::default(), &pod).await {
            Ok(created) => created,
            Err(kube::Error::Api(e)) if e.code == 409 => pods
                .get(name)
                .await
                .map_err(|e| format!("get pod {name}: {e}"))?,
            Err(e) => return Err(format!("create pod {name}: {e}")),
        };
        let uid = created.metadata.uid.ok_or("a pod without a UID")?;
        let request = token_request(Some((name, &uid)), TOKEN_SECONDS);
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &self.namespace);
        let token = accounts
            .create_subresource::<TokenRequest, TokenRequest>(
                "token",
                SERVICE_ACCOUNT,
                &PostParams::default(),
                &request,
            )
            .await
            .map_err(|e| format!("TokenRequest for pod {name}: {e}"))?
            .status
            .and_then(|s| s.token)
            .ok_or("a TokenRequest answered without a token")?;
        let kubeconfig = self.dir.join(format!("{name}.kubeconfig"));
        self.write_kubeconfig(&token, &kubeconfig)?;
        if let Some(proxy) = proxy {
            proxy.rewrite(&kubeconfig, &kubeconfig);
        }
        Ok(HolderPod {
            name: name.into(),
            uid,
            kubeconfig,
        })
    }

    /// The admin kubeconfig with `token` for every user and this namespace for every context.
    fn write_kubeconfig(&self, token: &str, path: &Path) -> Result<(), String> {
        let mut kubeconfig =
            Kubeconfig::read_from(&self.admin_kubeconfig).map_err(|e| e.to_string())?;
        for user in &mut kubeconfig.auth_infos {
            user.auth_info = Some(
                serde_json::from_value::<AuthInfo>(json!({ "token": token }))
                    .map_err(|e| e.to_string())?,
            );
        }
        for context in &mut kubeconfig.contexts {
            if let Some(c) = context.context.as_mut() {
                c.namespace = Some(self.namespace.clone());
            }
        }
        let yaml = serde_saphyr::to_string(&kubeconfig).map_err(|e| e.to_string())?;
        std::fs::write(path, yaml).map_err(|e| format!("write {}: {e}", path.display()))
    }
}
