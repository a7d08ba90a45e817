//! The unmodified-controller example (examples/plain_controller.sh): a controller that knows
//! nothing of fenced-lease — plain kubectl, no label, no token — run as two replicas, each in
//! its own pod under `kubectl fence run`, with a lease that fences the kinds it writes
//! (examples/plain-controller.yaml). The holder replica is frozen past its lease (SIGSTOP of
//! `kubectl fence` and the controller both, as a frozen VM would be) and thawed: every write it
//! makes from then on is refused by the apiserver, and the new holder's writes go through.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::cli::{kill, kill_group, pid_from, read, scratch, wait_exit};
use common::operator::OperatorProcess;
use common::pods::TestPod;
use common::{TestNamespace, repo_root, wait_for};

const WAIT: Duration = Duration::from_secs(60);

/// One replica: `kubectl fence run plain-controller -- plain_controller.sh` as `pod`, its
/// output (the controller's log of writes and kubectl fence's messages) in `log`, the
/// controller's PID (its process group) in `pid_file`.
async fn replica(ns: &TestNamespace, pod: &TestPod, log: &Path, pid_file: &Path) -> Child {
    let kubeconfig = ns.kubeconfig_as_pod(pod).await;
    let kubectl_dir = common::control_plane()
        .kubectl
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        kubectl_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = repo_root().join("examples/plain_controller.sh");
    let out = std::fs::File::create(log).unwrap();
    Command::new(common::bin("kubectl-fence"))
        .args([
            "run",
            "plain-controller",
            "--wait",
            "60s",
            "--grace",
            "10s",
            "--",
        ])
        .args([
            "sh",
            "-c",
            &format!(
                "echo $$ > {}; exec {}",
                pid_file.display(),
                script.display()
            ),
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("PATH", path)
        .env("POD_NAME", &pod.name)
        .env("POD_UID", &pod.uid)
        .env("POD_NAMESPACE", &ns.name)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("kubectl fence run")
}

/// The writes logged after line `from` of `log`: (number, what, outcome line) of each write
/// that started there.
fn writes_since(log: &str, from: usize) -> Vec<(String, Option<String>)> {
    let lines: Vec<&str> = log.lines().collect();
    lines[from.min(lines.len())..]
        .iter()
        .filter_map(|l| {
            l.strip_prefix("write ")?
                .split_once(" start")
                .map(|(n, _)| n.to_string())
        })
        .map(|n| {
            let outcome = lines
                .iter()
                .find(|l| l.starts_with(&format!("write {n} ")) && !l.contains(" start"))
                .map(|l| l.to_string());
            (n, outcome)
        })
        .collect()
}

/// The example's lease, its 10 s term shortened to keep the test short, and what the
/// controller writes: ConfigMap report and Deployment web.
fn apply_the_example(ns: &TestNamespace) {
    let lease =
        std::fs::read_to_string(repo_root().join("examples/plain-controller.yaml")).unwrap();
    let out =
        ns.kubectl_apply(&lease.replace("leaseDurationSeconds: 10", "leaseDurationSeconds: 3"));
    assert!(out.status.success(), "{}", common::cli::both(&out));
    let out = ns.kubectl_apply(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: report}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replicas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: example.invalid/web:1}]}\n",
    );
    assert!(out.status.success(), "{}", common::cli::both(&out));
}

/// Every write of the thawed replica logged in `log` after line `frozen_at` was refused, by
/// the identity rule, and at least one was answered; so was the last status it wrote on
/// SIGTERM.
fn assert_refused_since(log: &str, frozen_at: usize) {
    let after = writes_since(log, frozen_at);
    // A kubectl in flight when kubectl fence stops the controller is killed (`write N stopped`)
    // or says nothing; every write the apiserver answered was refused, by the identity rule.
    let mut refused = 0;
    for (n, outcome) in &after {
        let outcome = outcome.as_deref().unwrap_or("(no outcome: stopped)");
        assert!(
            !outcome.contains(" accepted "),
            "write {n} of the thawed replica was accepted: {outcome}\n{log}"
        );
        if outcome.contains("Error from server") {
            assert!(
                outcome.contains("(Forbidden)")
                    && outcome.contains("pod r1 does not hold FencedLease"),
                "write {n}: {outcome}"
            );
            refused += 1;
        }
    }
    assert!(
        refused > 0,
        "the apiserver answered no write of the thawed replica, so nothing was tested:\n{log}"
    );
    assert!(
        log.contains("refused (last status): Error from server (Forbidden)"),
        "the last status written on SIGTERM: {log}"
    );
}

#[tokio::test]
async fn a_frozen_replica_of_an_unmodified_controller_is_refused_every_write() {
    let ns = TestNamespace::new("plain-controller").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["r1", "r2"]).await;
    apply_the_example(&ns);

    let (log1, log2) = (scratch(&ns, "r1.log"), scratch(&ns, "r2.log"));
    let (pid1, pid2) = (scratch(&ns, "r1.pid"), scratch(&ns, "r2.pid"));
    let mut r1 = replica(&ns, &pods[0], &log1, &pid1).await;
    let controller1 = pid_from(&pid1).await;
    wait_for("r1's writes accepted", WAIT, || async {
        read(&log1).contains("accepted (status)").then_some(())
    })
    .await;
    let mut r2 = replica(&ns, &pods[1], &log2, &pid2).await;

    // Freeze r1 whole: kubectl fence and the controller's process group.
    kill(r1.id(), "STOP");
    kill_group(controller1, "STOP");
    let frozen_at = read(&log1).lines().count();
    wait_for("r2 writes as the new holder", WAIT, || async {
        read(&log2).contains("accepted (status)").then_some(())
    })
    .await;

    // Thaw the controller first, then kubectl fence: the controller writes before kubectl
    // fence sees the lease lost, then writes its last status on SIGTERM.
    kill_group(controller1, "CONT");
    kill(r1.id(), "CONT");
    let status = wait_exit(&mut r1, WAIT).await;
    assert_eq!(
        status.code(),
        Some(76),
        "r1 lost its lease: {}",
        read(&log1)
    );
    assert_refused_since(&read(&log1), frozen_at);

    // r2 holds on and its writes keep going through.
    let seen = read(&log2).matches("accepted").count();
    wait_for("r2 keeps writing", WAIT, || async {
        (read(&log2).matches("accepted").count() > seen + 3).then_some(())
    })
    .await;
    assert!(!read(&log2).contains(" refused "), "{}", read(&log2));
    kill(r2.id(), "TERM");
    wait_exit(&mut r2, WAIT).await;
}
