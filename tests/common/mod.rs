//! Test harness: a real kube-apiserver + etcd (RBAC on), the CRDs applied with kubectl as a
//! user would, a fresh namespace per test, and clients that act as a given ServiceAccount.
//!
//! One control plane serves the whole test run: the harness reuses the one `KUBECONFIG`
//! points at when that is a `hack/control-plane` cluster, and otherwise starts one with
//! `hack/control-plane up` (idempotent, so every test binary shares it).
#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod bulk;
pub mod cli;
pub mod fence;
pub mod operator;
pub mod pods;
pub mod prometheus;
pub mod proxy;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Name of the cluster entry in kubeconfigs written by `hack/control-plane`.
const TEST_CLUSTER_NAME: &str = "fenced-lease-test";

/// Per-call timeout for API requests made by tests.
pub const API_TIMEOUT: Duration = Duration::from_secs(20);

/// The control plane shared by all tests of this process.
pub struct ControlPlane {
    pub kubeconfig: PathBuf,
    pub kubectl: PathBuf,
}

/// The repository's root (this package is its `tests/`).
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
}

/// The path of a binary of this workspace (`kubectl-fence`, `fenced-lease-operator`), in the
/// target directory of the running test. Cargo builds a package's binaries for its own tests
/// only, and these are in other packages: the first call builds them unless `FL_BINS_BUILT`
/// says the caller (hack/test) has, as hack/test does (`cargo build --workspace --all-targets`:
/// with the test targets, the features resolve as for `cargo test --test NAME`, so the build
/// reuses the test's libraries and returns at once when the binaries are current).
pub fn bin(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(build_bins).join(name)
}

fn build_bins() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/<test>-<hash>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test binary under target/<profile>/deps")
        .to_path_buf();
    if std::env::var_os("FL_BINS_BUILT").is_none() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(repo_root()).args([
            "build",
            "--locked",
            "--quiet",
            "--all-features",
            "--workspace",
            "--all-targets",
        ]);
        if dir.file_name().is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
        assert!(status.success(), "{cmd:?} failed ({status})");
    }
    dir
}

/// The name libtest knows test `function` of module `module` by (`module_path!()`, which
/// starts with the crate's name; libtest's names do not): for a test binary that runs itself
/// again with `--exact` to run one of its ignored tests as a child process.
pub fn test_name(module: &str, function: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{function}"),
        None => function.to_string(),
    }
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

fn control_plane_script() -> Command {
    Command::new(repo_root().join("hack/control-plane"))
}

/// Is `kubeconfig` a running control plane made by `hack/control-plane`? Anything else (a
/// developer's real cluster, say) is never used by the tests.
fn is_running_test_cluster(kubectl: &Path, kubeconfig: &Path) -> bool {
    let name = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].name}",
        ])
        .output();
    let is_ours = matches!(name, Ok(out) if out.status.success() && out.stdout == TEST_CLUSTER_NAME.as_bytes());
    is_ours
        && Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--request-timeout=5s", "get", "--raw", "/readyz"])
            .output()
            .is_ok_and(|out| out.status.success())
}

/// Starts (or finds) the control plane and installs the CRDs, once per test process.
pub fn control_plane() -> &'static ControlPlane {
    static CP: OnceLock<ControlPlane> = OnceLock::new();
    CP.get_or_init(|| {
        let bin_dir = run(control_plane_script().arg("bin-dir")).stdout;
        let kubectl = PathBuf::from(String::from_utf8_lossy(&bin_dir).trim()).join("kubectl");
        let reusable = std::env::var_os("KUBECONFIG")
            .map(PathBuf::from)
            .filter(|kc| kubectl.exists() && is_running_test_cluster(&kubectl, kc));
        let kubeconfig = match reusable {
            Some(kc) => kc,
            None => {
                let out = run(control_plane_script().arg("up"));
                let stdout = String::from_utf8_lossy(&out.stdout);
                let last = stdout.lines().last().unwrap_or_default();
                let path = last.strip_prefix("export KUBECONFIG=").unwrap_or_else(|| {
                    panic!("unexpected output of hack/control-plane up: {stdout}")
                });
                PathBuf::from(path)
            }
        };
        let cp = ControlPlane {
            kubeconfig,
            kubectl,
        };
        cp.install_crds();
        cp
    })
}

impl ControlPlane {
    /// `kubectl apply -f crds/` and the admission policies of `deploy/admission/`, exactly as
    /// a user installs them, and waits until both kinds can be created (`hack/crds install`:
    /// `Established` is not enough while admission has not yet seen the claim's schema).
    pub fn install_crds(&self) {
        run(&mut self.install_crds_command());
    }

    /// The `hack/crds install` that [`Self::install_crds`] runs, for callers that must not
    /// panic when it fails.
    pub fn install_crds_command(&self) -> Command {
        let mut cmd = Command::new(repo_root().join("hack/crds"));
        cmd.arg("install")
            .env("KUBECTL", &self.kubectl)
            .env("KUBECONFIG", &self.kubeconfig);
        cmd
    }

    /// `hack/control-plane restart` of this control plane: etcd and the apiserver stopped and
    /// started again in place (same ports, same data), so every watch relists. Returns once
    /// the script does, with its output, whatever came of it.
    pub fn restart_command(&self) -> Command {
        // The runtime directory is the kubeconfig's.
        let run_dir = self.kubeconfig.parent().expect("runtime dir").to_path_buf();
        let mut cmd = control_plane_script();
        cmd.arg("restart").env("FL_CP_DIR", run_dir);
        cmd
    }

    /// `kubectl` with the admin kubeconfig.
    pub fn kubectl_cmd(&self) -> Command {
        let mut cmd = Command::new(&self.kubectl);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--request-timeout=30s");
        cmd
    }

    /// Client config of the cluster admin.
    pub async fn admin_config(&self) -> Config {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).expect("read kubeconfig");
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig");
        config.read_timeout = Some(API_TIMEOUT);
        config.write_timeout = Some(API_TIMEOUT);
        config.connect_timeout = Some(Duration::from_secs(5));
        config
    }
}

/// A fresh namespace for one test, deleted (in the background) when dropped.
pub struct TestNamespace {
    pub name: String,
    pub client: Client,
    cp: &'static ControlPlane,
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

// ---- Holder-side helpers (the holder modules of tests/timed and tests/cluster) ----

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

/// Waits for claim `name`'s next accepted renew: the instant its `renewTime` is seen to change
/// to a new value.
pub async fn next_renew(
    claims: &Api<fenced_lease::api::FencedLeaseClaim>,
    name: &str,
) -> std::time::Instant {
    use futures::StreamExt;
    let events = kube::runtime::watcher::watch_object(claims.clone(), name);
    let mut events = std::pin::pin!(events);
    let mut last = None;
    while let Some(event) = events.next().await {
        let beat = event
            .ok()
            .flatten()
            .and_then(|c| c.spec.renew_time)
            .map(|t| t.0);
        if last.is_some() && beat != last {
            return std::time::Instant::now();
        }
        last = beat.or(last);
    }
    panic!("claim watch ended");
}

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A plain HTTP/1.0 GET: (status code, body).
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// A client from a kubeconfig file (a ServiceAccount's, say); no read timeout, since
/// holders keep watches open.
pub async fn client_from_kubeconfig(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    config.read_timeout = None;
    fenced_lease::client::client(config).expect("client")
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
