//! A fresh namespace per test, deleted when the test ends, and what a test does in it as
//! cluster-admin or as a ServiceAccount.

use super::*;

/// A fresh namespace for one test, deleted (in the background) when dropped.
pub struct TestNamespace {
    pub name: String,
    pub client: Client,
    pub(super) cp: &'static ControlPlane,
}

impl TestNamespace {
    /// Creates namespace `<prefix>-<random>` and an admin client.
    pub async fn new(prefix: &str) -> Self {
        let cp = control_plane();
        let client = Client::try_from(cp.admin_config().await).expect("admin client");
        let name = format!("{prefix}-{:08x}", rand::random::<u32>());
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        Self { name, client, cp }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// `kubectl -n <namespace>` as the admin.
    pub fn kubectl(&self) -> Command {
        let mut cmd = self.cp.kubectl_cmd();
        cmd.args(["-n", &self.name]);
        cmd
    }

    /// Creates ServiceAccount `name` in this namespace and returns a client that
    /// authenticates as it (a bound token from the TokenRequest API), for RBAC tests.
    pub async fn client_as_service_account(&self, name: &str) -> Client {
        self.client_as(name, None).await
    }

    /// Applies YAML (or JSON) with kubectl as the admin; returns the output, stderr included.
    pub fn kubectl_apply(&self, manifest: &str) -> Output {
        use std::io::Write;
        let mut child = self
            .kubectl()
            .args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn kubectl");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(manifest.as_bytes())
            .unwrap();
        child.wait_with_output().expect("kubectl apply")
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Best effort: the control plane's namespace controller removes the contents. The
        // test's operator is gone by now, so nothing would remove the leases' finalizers.
        if let Ok(out) = self
            .kubectl()
            .args(["get", "fencedleases", "-o", "name"])
            .output()
        {
            for lease in String::from_utf8_lossy(&out.stdout).lines() {
                let _ = self
                    .kubectl()
                    .args([
                        "patch",
                        lease,
                        "--type=merge",
                        "-p",
                        r#"{"metadata":{"finalizers":null}}"#,
                    ])
                    .output();
            }
        }
        // The kubeconfigs written for this namespace's ServiceAccounts and pods (their tokens).
        let prefix = format!("{}-", self.name);
        if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with(&prefix) && name.ends_with(".kubeconfig") {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        let _ = self
            .cp
            .kubectl_cmd()
            .args(["delete", "namespace", &self.name, "--wait=false"])
            .output();
    }
}

/// The message of an API error, for asserting what a user would read.
pub fn api_error_message<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}
