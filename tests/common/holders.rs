//! Holder-side helpers (the holder modules of tests/timed and tests/cluster): leases and claims
//! created, the clients and kubeconfigs a holder uses, granted tokens read, heartbeats sent.

use super::*;

impl TestNamespace {
    /// Creates FencedLease `name` with the given lease duration.
    pub fn create_lease(&self, name: &str, duration_seconds: i32) {
        let out = self.kubectl_apply(&format!(
            "apiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata:\n  name: \"{name}\"\nspec:\n  leaseDurationSeconds: {duration_seconds}\n"
        ));
        assert!(
            out.status.success(),
            "create lease: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// An admin client for holders: no read timeout, since holders keep watches open.
    pub async fn holder_client(&self) -> Client {
        let mut config = self.cp.admin_config().await;
        config.read_timeout = None;
        fenced_lease::client::client(config).expect("holder client")
    }

    /// The admin kubeconfig path, for child processes.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.cp.kubeconfig
    }

    /// The admin client configuration.
    pub async fn client_config(&self) -> Config {
        self.cp.admin_config().await
    }

    /// Creates ServiceAccount `name`, bound to the holder Role of deploy/rbac/holder-role.yaml
    /// when `bind_holder_role`, and writes a kubeconfig that authenticates as it.
    pub async fn holder_service_account_kubeconfig(
        &self,
        name: &str,
        bind_holder_role: bool,
    ) -> PathBuf {
        // Creates the ServiceAccount; the client itself is not needed.
        let _ = self.client_as_service_account(name).await;
        if bind_holder_role {
            let role = std::fs::read_to_string(repo_root().join("deploy/rbac/holder-role.yaml"))
                .expect("read holder role");
            let out = self.kubectl_apply(&role);
            assert!(
                out.status.success(),
                "apply role: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let out = self.kubectl_apply(&format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: {name}-holder\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: fenced-lease-holder\nsubjects:\n  - kind: ServiceAccount\n    name: {name}\n    namespace: {ns}\n",
                ns = self.name
            ));
            assert!(
                out.status.success(),
                "bind role: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.service_account_kubeconfig(name)
    }

    /// Writes a kubeconfig that authenticates as ServiceAccount `name` of this namespace.
    pub fn service_account_kubeconfig(&self, name: &str) -> PathBuf {
        let token = run(self
            .kubectl()
            .args(["create", "token", name, "--duration=1h"]))
        .stdout;
        let token = String::from_utf8_lossy(&token).trim().to_string();
        self.kubeconfig_with_token(&token, name)
    }

    /// Writes a kubeconfig, named after `stem`, that authenticates with bearer `token`, its
    /// context's namespace this one.
    pub fn kubeconfig_with_token(&self, token: &str, stem: &str) -> PathBuf {
        let mut kubeconfig = Kubeconfig::read_from(&self.cp.kubeconfig).expect("read kubeconfig");
        for user in &mut kubeconfig.auth_infos {
            user.auth_info = Some(
                serde_json::from_value::<AuthInfo>(serde_json::json!({ "token": token }))
                    .expect("auth info"),
            );
        }
        for context in &mut kubeconfig.contexts {
            if let Some(c) = context.context.as_mut() {
                c.namespace = Some(self.name.clone());
            }
        }
        let path = std::env::temp_dir().join(format!("{}-{stem}.kubeconfig", self.name));
        let yaml = serde_saphyr::to_string(&kubeconfig).expect("serialize kubeconfig");
        std::fs::write(&path, yaml).expect("write kubeconfig");
        path
    }
}

impl TestNamespace {
    /// Creates claim `name` for `lease` (identity = name), naming `pod` if given; its UID.
    pub async fn create_claim(&self, name: &str, lease: &str, pod: Option<&str>) -> String {
        let mut spec = serde_json::json!({"leaseName": lease, "holderIdentity": name});
        if let Some(pod) = pod {
            spec["podName"] = serde_json::json!(pod);
        }
        let claim: fenced_lease::api::FencedLeaseClaim =
            serde_json::from_value(serde_json::json!({
                "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
                "metadata": {"name": name}, "spec": spec,
            }))
            .expect("claim object");
        let created = self
            .api()
            .create(&PostParams::default(), &claim)
            .await
            .expect("create claim");
        created.metadata.uid.expect("uid")
    }

    /// The token of claim `name` once it is `Granted`, as `kubectl get fclaim` shows it.
    pub async fn granted_token(&self, name: &str) -> Option<i64> {
        let claim: fenced_lease::api::FencedLeaseClaim = self.api().get(name).await.ok()?;
        let status = claim.status?;
        (status.phase == Some(fenced_lease::api::ClaimPhase::Granted))
            .then_some(status.fencing_token?)
    }
}

/// The claims `api` lists whose holder identity is `identity`.
pub async fn claims_of(
    api: &Api<fenced_lease::api::FencedLeaseClaim>,
    identity: &str,
) -> Vec<fenced_lease::api::FencedLeaseClaim> {
    api.list(&kube::api::ListParams::default())
        .await
        .expect("list claims")
        .items
        .into_iter()
        .filter(|c| c.spec.holder_identity == identity)
        .collect()
}

impl TestNamespace {
    /// Deletes FencedLease `name` and waits until it is gone (its finalizer has run).
    pub async fn delete_lease(&self, name: &str) {
        let leases: Api<fenced_lease::api::FencedLease> = self.api();
        leases
            .delete(name, &kube::api::DeleteParams::default())
            .await
            .expect("delete lease");
        wait_for(
            &format!("lease {name} to be gone"),
            Duration::from_secs(30),
            || async {
                leases
                    .get_opt(name)
                    .await
                    .expect("get lease")
                    .is_none()
                    .then_some(())
            },
        )
        .await;
    }
}

/// A background heartbeat of one claim, as a live candidate sends it; stops when dropped.
pub struct Beating {
    stop: tokio_util::sync::CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Beating {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl TestNamespace {
    /// Heartbeats claim `name` every `every` until the returned handle is dropped (a waiter
    /// that stops beating for a lease duration is skipped and expired by the operator).
    ///
    /// The beats run on a thread and a runtime of their own, with their own client: a test
    /// that blocks its runtime (kubectl run with `std::process`, as most do) must not starve
    /// them, or the operator expires the claim while the test relies on it.
    pub fn keep_beating(&self, name: &str, every: Duration) -> Beating {
        let (cp, ns, name) = (self.cp, self.name.clone(), name.to_string());
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("heartbeat runtime");
            runtime.block_on(async move {
                let client = Client::try_from(cp.admin_config().await).expect("admin client");
                let api: Api<fenced_lease::api::FencedLeaseClaim> = Api::namespaced(client, &ns);
                loop {
                    let now = k8s_openapi::jiff::Timestamp::now().to_string();
                    let patch = serde_json::json!({"spec": {"renewTime": now}});
                    let (params, patch) = (
                        kube::api::PatchParams::default(),
                        kube::api::Patch::Merge(&patch),
                    );
                    let beat = api.patch(&name, &params, &patch);
                    tokio::select! {
                        () = stopped.cancelled() => return,
                        _ = beat => {}
                    }
                    tokio::select! {
                        () = stopped.cancelled() => return,
                        () = tokio::time::sleep(every) => {}
                    }
                }
            });
        });
        Beating {
            stop,
            thread: Some(thread),
        }
    }
}
