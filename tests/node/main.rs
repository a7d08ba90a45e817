//! On a real node (hack/node, started by `make test-node`: hack/test-node): the packaged chart
//! installed with Helm runs the operator's image as two replicas, Ready through their probes,
//! one leading; `helm test` passes with its own pod; the double dividend's workers run as pods,
//! one frozen and its writes refused, and so are a followed client-go election's replicas; a token reaches a pod's files (hack/test-node's
//! bench-token-delivery measures how fast); deleting the leading pod hands over at once;
//! a leader frozen past its lease is replaced, exits on thawing and is restarted by the kubelet;
//! `helm uninstall` leaves only what the README says it keeps.
//!
//! One test, in order: each step needs the release the first installed. Environment (set by
//! hack/test-node): KUBECONFIG (a control plane of its own, FL_CP_SERVICE_ACCOUNTS=1),
//! FL_NODE_CHART (the packaged chart), FL_NODE_DEMO_IMAGE, FL_NODE_OPERATOR_IMAGE,
//! FL_NODE_EXAMPLES (the examples' binaries), FL_NODE_BENCH (the benchmarks'), FL_POSTGRES_URL,
//! FL_NODE_POSTGRES_URL (PostgreSQL as pods reach it), FL_NODE_LOG_DIR (where the measurement
//! keeps its reports).

extern crate fenced_lease_tests as common;

mod chart;
mod follow;
mod leader;
mod node;

use std::path::PathBuf;
use std::process::Command;

use node::env;

/// The release's name and namespace.
const RELEASE: &str = "fl";
const NAMESPACE: &str = "fenced-lease";
/// The chart's leader-election lease, shortened so that a frozen leader is replaced soon.
const LEADER_LEASE_SECONDS: u64 = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_and_the_holders_run_as_pods_on_a_real_node() {
    let client = kube::Client::try_default().await.expect("KUBECONFIG");
    chart::install(&client).await;
    chart::helm_test();
    double_dividend_with_pods();
    token_delivery();
    follow::a_frozen_leader_of_a_followed_lease_is_refused(&client).await;
    leader::deleting_the_leading_pod_hands_over(&client).await;
    leader::a_frozen_leader_is_replaced_then_restarted(&client).await;
    chart::uninstall_leaves_what_the_readme_says(&client).await;
}

/// `examples/double_dividend` with `--pods`: its workers are pods of the demo image; the first
/// is frozen past its lease and every one of its stale writes is refused (the program exits 0
/// only then, and says so).
fn double_dividend_with_pods() {
    let namespace = "double-dividend";
    node::kubectl(&["create", "namespace", namespace]);
    let program = PathBuf::from(env("FL_NODE_EXAMPLES")).join("double-dividend");
    let out = Command::new(&program)
        .args([
            "--namespace",
            namespace,
            "--pods",
            &env("FL_NODE_DEMO_IMAGE"),
        ])
        .args(["--pods-postgres-url", &env("FL_NODE_POSTGRES_URL")])
        .arg("--log-dir")
        .arg(std::env::temp_dir())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the double dividend failed with pods: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("freeze (cgroup freezer) the pod of worker-a")
            && stdout.contains("OK: the dividend was paid once"),
        "{stdout}"
    );
    node::kubectl(&["delete", "namespace", namespace, "--wait=false"]);
}

/// `bench/src/bin/token_delivery.rs`, 50 grants: a pod's token in a downward-API file and in
/// the file of a `kubectl fence token -w` sidecar (the operator's image). It prints its figures;
/// this asserts only that every grant reached both files (the program fails otherwise).
fn token_delivery() {
    let program = PathBuf::from(env("FL_NODE_BENCH")).join("bench-token-delivery");
    let status = Command::new(&program)
        .args(["--image", &env("FL_NODE_DEMO_IMAGE")])
        .args(["--sidecar-image", &env("FL_NODE_OPERATOR_IMAGE")])
        .args([
            "--holder-cluster-role",
            &format!("{RELEASE}-fenced-lease-holder"),
        ])
        .args(["--grants", "50", "--log-dir", &env("FL_NODE_LOG_DIR")])
        .status()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    assert!(status.success(), "bench-token-delivery failed: {status}");
}
