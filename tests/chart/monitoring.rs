//! The chart's opt-in monitoring against prometheus-operator's real CRDs: the PrometheusRule
//! (the rules of deploy/monitoring/alerts.yaml), the ServiceMonitor, and the ConfigMap that
//! Grafana's sidecar loads the dashboard from.

use std::process::Command;
use std::sync::Once;

use serde_json::Value;

use crate::common::{control_plane, repo_root, run};
use crate::helm::{Release, documents};

/// The `--set` values that turn it all on.
pub const ENABLED: [&str; 3] = [
    "metrics.serviceMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.dashboard.enabled=true",
];

/// Installs prometheus-operator's ServiceMonitor and PrometheusRule CRDs, as its release ships
/// them (hack/prometheus-operator-crds), and waits until they are established.
pub fn install_crds() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let out = run(Command::new(repo_root().join("hack/prometheus-operator-crds")).arg("dir"));
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let files = ["servicemonitors", "prometheusrules"]
            .map(|kind| format!("{dir}/monitoring.coreos.com_{kind}.yaml"));
        let mut apply = control_plane().kubectl_cmd();
        apply.args(["apply", "--server-side", "--force-conflicts"]);
        for file in &files {
            apply.args(["-f", file]);
        }
        run(&mut apply);
        run(control_plane().kubectl_cmd().args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        ]));
    });
}

fn get(kind: &str, namespace: &str, name: &str) -> Value {
    let out = run(control_plane()
        .kubectl_cmd()
        .args(["get", kind, name, "-n", namespace, "-o", "json"]));
    serde_json::from_slice(&out.stdout).expect("kubectl get -o json")
}

/// Alert names of rule groups, in order.
fn alerts(groups: &Value) -> Vec<String> {
    groups
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .filter_map(|r| r["alert"].as_str().map(String::from))
        .collect()
}

/// What the release installed is what deploy/monitoring/ holds, stored by the apiserver
/// under prometheus-operator's schemas.
pub fn assert_installed(release: &Release, lease_seconds: u32) {
    let ns = &release.namespace;
    let source = std::fs::read_to_string(repo_root().join("deploy/monitoring/alerts.yaml"))
        .expect("deploy/monitoring/alerts.yaml");
    let source = documents(&source).remove(0);
    let rule = get("prometheusrule", ns, &release.fullname);
    let installed = &rule["spec"]["groups"];
    assert_eq!(alerts(installed), alerts(&source["groups"]));
    assert!(alerts(installed).len() >= 6, "{:?}", alerts(installed));
    let no_leader = installed
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .find(|r| r["alert"] == "FencedLeaseNoLeader")
        .expect("FencedLeaseNoLeader");
    assert_eq!(no_leader["for"], format!("{lease_seconds}s"));

    let monitor = get("servicemonitor", ns, &release.fullname);
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");

    let dashboard = get("configmap", ns, &format!("{}-dashboard", release.fullname));
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let text = dashboard["data"]["fenced-lease.json"]
        .as_str()
        .expect("the dashboard's key");
    let loaded: Value = serde_json::from_str(text).expect("the dashboard is JSON");
    let source = std::fs::read_to_string(repo_root().join("deploy/monitoring/dashboard.json"))
        .expect("deploy/monitoring/dashboard.json");
    let source: Value = serde_json::from_str(&source).unwrap();
    assert_eq!(loaded, source);
}
