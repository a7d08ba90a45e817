//! The Helm chart (charts/fenced-lease), with real Helm against the test apiserver, a module
//! per subject:
//!
//! - `templates`: what it renders carries current copies of crds/, deploy/rbac/ and
//!   deploy/admission/, one image of this version, and only what the cluster serves;
//! - `install`: install, upgrade and uninstall keep the CRDs and the leases (the test at the top
//!   of this file), a wrong value fails the install naming it, the pod meets the restricted Pod
//!   Security profile;
//! - `permissions`: installed, the operator runs with the chart's ServiceAccount through the
//!   core scenario (`scenario`) and needs every permission the chart grants and no other, and
//!   serves listed namespaces through RoleBindings; the holder ClusterRole is all
//!   `kubectl fence` needs (checked against the audit log, `audit`);
//! - `monitoring`, `alerts`, `reported`: its alerts, ServiceMonitor and dashboard install under
//!   prometheus-operator's CRDs, and its critical alert fires in a real Prometheus when the
//!   fence refuses a write, or a guard refuses one and the holder reports it.
//!
//! The packaged chart installed on a real node, its image's pods and `helm test`: tests/node
//! (`make test-node`).

extern crate fenced_lease_tests as common;

mod alerts;
mod audit;
mod helm;
mod install;
mod monitoring;
mod operator;
mod permissions;
mod reported;
mod scenario;
mod templates;

use std::time::Duration;

use common::TestNamespace;
use helm::Release;

const WAIT: Duration = Duration::from_secs(30);

/// Tests that run an operator or create leases hold this: a cluster-wide operator would serve
/// the other tests' leases too.
static OPERATORS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// hack/compat runs this test by its full name, so it stays at the top of the binary; its
/// steps are in `install`.
#[tokio::test]
async fn install_upgrade_and_uninstall_keep_the_crds_and_the_leases() {
    // Its lease must not meet another test's cluster-wide operator (a finalizer nobody removes).
    let _serial = OPERATORS.lock().await;
    audit::log_path(); // turning the audit log on restarts the apiserver: not mid-test
    let home = TestNamespace::new("chart-life").await;
    // Dropped after the release: the policies go with it however this test ends.
    let _reinstall = install::ReinstallPolicies;
    let release = Release::named(&home.name);
    install::install_taking_over(&release);
    install::assert_installed(&release, &home.name);
    home.create_lease("kept", 15);
    install::upgrade_with_a_value_changed(&release, &home.name);
    install::uninstall_keeps_the_crds_and_the_leases(&release, &home.name);
}
