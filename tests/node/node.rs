//! What the steps share: the environment hack/test-node sets, kubectl and Helm against its
//! control plane, waiting on conditions, and a pod's cgroup freezer.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

/// A variable hack/test-node sets; panics naming it when it is missing.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: the node tests run under `make test-node` (hack/test-node)")
    })
}

/// The control plane's kubectl (KUBECONFIG names the node's control plane).
fn kubectl_command() -> Command {
    let bin_dir =
        common::run(Command::new(common::repo_root().join("hack/control-plane")).arg("bin-dir"));
    Command::new(PathBuf::from(String::from_utf8_lossy(&bin_dir.stdout).trim()).join("kubectl"))
}

/// `kubectl ARGS` against the node's control plane; its stdout.
pub fn kubectl(args: &[&str]) -> String {
    let out = common::run(kubectl_command().args(args));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl apply -f -` of `yaml`.
pub fn kubectl_apply(yaml: &str) {
    use std::io::Write;
    let mut child = kubectl_command()
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl apply");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(yaml.as_bytes())
        .expect("write");
    assert!(
        child.wait().expect("kubectl apply").success(),
        "kubectl apply failed:\n{yaml}"
    );
}

/// `helm ARGS` (hack/helm's) against the node's control plane.
pub fn helm(args: &[&str]) -> Output {
    common::run(
        Command::new(common::repo_root().join("hack/helm"))
            .arg("helm")
            .args(args),
    )
}

/// Polls `check` every 100 ms until it returns `Some`; panics naming `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the pod's containers are all Ready.
pub fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// How many times the kubelet restarted the pod's containers.
pub fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |c| c.iter().map(|c| c.restart_count).sum())
}

/// Freezes (or thaws) every process of the pod: its cgroup's freezer, as a stopped VM or a
/// stop-the-world pause looks from outside. The node is this machine, cgroup v1, cgroupfs.
pub fn freeze(uid: &str, frozen: bool) {
    let root = Path::new("/sys/fs/cgroup/freezer/kubepods");
    let dir = ["", "besteffort", "burstable"]
        .iter()
        .map(|qos| root.join(qos).join(format!("pod{uid}")))
        .find(|d| d.is_dir())
        .unwrap_or_else(|| panic!("no freezer cgroup for pod {uid} under {}", root.display()));
    let state = if frozen { "FROZEN" } else { "THAWED" };
    let file = dir.join("freezer.state");
    std::fs::write(&file, state).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&file).is_ok_and(|s| s.trim() == state) {
        assert!(
            Instant::now() < deadline,
            "{} never read {state}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
