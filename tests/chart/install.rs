//! Installing the chart with real Helm: the objects an install creates, an upgrade with a value
//! changed, an uninstall that keeps the CRDs and the leases (the test itself is at the top of
//! the binary, where hack/compat names it), a wrong value refused by name, and the operator's
//! pod under the restricted Pod Security profile.

use serde_json::{Value, json};

use crate::audit;
use crate::common::{self, TestNamespace};
use crate::helm::{Release, find, render, run_ok};

/// `kubectl ARGS -o json` as the cluster's admin; panics unless it succeeds.
fn get(args: &[&str]) -> Value {
    let out = run_ok(
        common::control_plane()
            .kubectl_cmd()
            .args(args)
            .args(["-o", "json"]),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Whether `kubectl ARGS` says NotFound.
fn gone(args: &[&str]) -> bool {
    let out = common::control_plane()
        .kubectl_cmd()
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stderr).contains("NotFound")
}

/// Installs `release` over the CRDs and admission policies that exist already (the test
/// harness applied crds/ and deploy/admission/ with kubectl): the chart takes them over, as
/// after an install by hand. The NOTES say what to do next.
pub fn install_taking_over(release: &Release) {
    let out = release.try_install_with(&["--take-ownership", "--force-conflicts"], &[]);
    assert!(
        out.status.success(),
        "helm install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let notes = String::from_utf8_lossy(&out.stdout);
    assert!(
        notes.contains(&format!("--clusterrole={}", release.object("holder")))
            && notes.contains("kubectl fence run"),
        "NOTES say what to do next:\n{notes}"
    );
}

/// What an install creates in `namespace` and cluster-wide, the CRDs taken over and kept.
pub fn assert_installed(release: &Release, namespace: &str) {
    let operator = release.object("operator");
    let deployment = get(&["get", "deployment", &operator, "-n", namespace]);
    assert_eq!(deployment["spec"]["replicas"], 2);
    for (kind, name) in [
        ("poddisruptionbudget", operator.clone()),
        ("service", release.object("metrics")),
        ("serviceaccount", operator.clone()),
        ("role", operator.clone()),
        ("rolebinding", operator.clone()),
    ] {
        get(&["get", kind, &name, "-n", namespace]);
    }
    for (kind, name) in [
        ("clusterrole", operator.clone()),
        ("clusterrolebinding", operator.clone()),
        ("clusterrole", release.object("holder")),
    ] {
        get(&["get", kind, &name]);
    }
    for crd in ["fencedleases.fencing.dev", "fencedleaseclaims.fencing.dev"] {
        let crd = get(&["get", "crd", crd]);
        assert_eq!(
            crd["metadata"]["annotations"]["meta.helm.sh/release-name"],
            *release.name
        );
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"],
            "keep"
        );
    }
}

/// Upgrade with a value changed: the Deployment follows.
pub fn upgrade_with_a_value_changed(release: &Release, namespace: &str) {
    release.upgrade(&["replicaCount=3", "leaderElection.leaseDurationSeconds=20"]);
    let operator = release.object("operator");
    let deployment = get(&["get", "deployment", &operator, "-n", namespace]);
    assert_eq!(deployment["spec"]["replicas"], 3);
    let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_array()
            .unwrap()
            .contains(&json!("--leader-election-lease-seconds=20")),
        "{args}"
    );
}

/// Uninstall: the operator and its RBAC go; the CRDs and lease `kept` stay.
pub fn uninstall_keeps_the_crds_and_the_leases(release: &Release, namespace: &str) {
    let operator = release.object("operator");
    let out = release.uninstall();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("kept due to the resource policy"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(gone(&["get", "deployment", &operator, "-n", namespace]));
    assert!(gone(&["get", "clusterrole", &operator]));
    assert!(gone(&["get", "clusterrole", &release.object("holder")]));
    get(&["get", "crd", "fencedleases.fencing.dev"]);
    get(&["get", "fencedlease", "kept", "-n", namespace]);
}

/// Applies crds/ and deploy/admission/ again when dropped: a release that took over the
/// policies the harness applied takes them with it when it goes, and the tests that follow need
/// them, even after a failed test. It cannot panic (a drop may run while a test unwinds).
pub struct ReinstallPolicies;

impl Drop for ReinstallPolicies {
    fn drop(&mut self) {
        let out = common::control_plane().install_crds_command().output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("reinstalling crds/ and deploy/admission/: {out:?}");
        }
    }
}

#[tokio::test]
async fn a_wrong_value_fails_the_install_naming_it() {
    audit::log_path(); // turning the audit log on restarts the apiserver: not mid-test
    let ns = TestNamespace::new("chart-badvalue").await;
    let release = Release::named(&ns.name);
    let out = release.try_install(&["replicaCount=two", "crds.enabled=false"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "installed with replicaCount=two");
    assert!(
        stderr.contains("/replicaCount") && stderr.contains("want integer"),
        "the message names the value and what it should be: {stderr}"
    );
    let out = release.try_install(&["crds.enabled=false", "replicas=3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("additional properties 'replicas' not allowed"),
        "an unknown key is refused by name: {stderr}"
    );
    let deployments = ns
        .kubectl()
        .args(["get", "deployments", "-o", "name"])
        .output()
        .unwrap();
    assert!(deployments.stdout.is_empty(), "nothing was installed");
}

#[tokio::test]
async fn the_operator_pod_meets_the_restricted_pod_security_profile() {
    audit::log_path(); // turning the audit log on restarts the apiserver: not mid-test
    let ns = TestNamespace::new("chart-psa").await;
    run_ok(common::control_plane().kubectl_cmd().args([
        "label",
        "namespace",
        &ns.name,
        "pod-security.kubernetes.io/enforce=restricted",
    ]));
    let objects = render(&ns.name, &[]);
    let spec =
        find(&objects, "Deployment", "fenced-lease-operator")["spec"]["template"]["spec"].clone();
    let pod = |name: &str, spec: &Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
            .to_string()
    };
    let out = ns.kubectl_apply(&pod("operator", &spec));
    assert!(
        out.status.success(),
        "the apiserver's PodSecurity admission refuses the chart's pod: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The check is live: the same pod without its container securityContext is refused.
    let mut loose = spec.clone();
    loose["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("securityContext");
    let out = ns.kubectl_apply(&pod("loose", &loose));
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("violates PodSecurity \"restricted"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
