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

mod control_plane;
mod holders;
mod namespace;

pub use control_plane::{ControlPlane, client_from_kubeconfig, control_plane};
pub use holders::{Beating, claims_of};
pub use namespace::{TestNamespace, api_error_message};

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
