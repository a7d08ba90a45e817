//! What the chart grants, against the apiserver's audit log: the operator, run with the
//! Deployment's args and the chart ServiceAccount's token through the core scenario, needs
//! every permission the chart grants and no other; limited to listed namespaces it serves them
//! through RoleBindings; the holder ClusterRole is all `kubectl fence` and the library need.
//! A refused request or a permission never used fails the test.

use std::process::Command;
use std::time::Duration;

use fenced_lease::api::FencedLeaseClaim;

use crate::common::operator::OperatorProcess;
use crate::common::{self, TestNamespace};
use crate::helm::{Release, find, run_ok};
use crate::operator::ChartOperator;
use crate::scenario::{core_scenario, create_fenced_lease, grant_and_release};
use crate::{OPERATORS, WAIT, audit, monitoring};

/// Waits until the authorizer applies `user`'s bindings (they reach it through an informer).
fn wait_bindings_in_force(user: &str, checks: &[(&str, &str, Option<&str>)]) {
    for (verb, resource, namespace) in checks {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let mut cmd = common::control_plane().kubectl_cmd();
            cmd.args(["auth", "can-i", verb, resource, "--as", user]);
            if let Some(ns) = namespace {
                cmd.args(["-n", ns]);
            }
            if cmd.output().unwrap().status.success() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{user} never got {verb} {resource}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Runs `scenario`; if it fails, says which of `user`'s requests the apiserver refused (a
/// missing permission shows as a wait that times out).
async fn explain_failure(user: &str, scenario: impl std::future::Future<Output = ()>) {
    use futures::FutureExt;
    if let Err(panic) = std::panic::AssertUnwindSafe(scenario).catch_unwind().await {
        let refused = audit::forbidden(&audit::requests_by(user));
        if !refused.is_empty() {
            panic!(
                "{user} lacks permissions it needs; refused:\n  {}",
                refused.join("\n  ")
            );
        }
        std::panic::resume_unwind(panic);
    }
}

/// Polls the audit log until every permission was used, or the deadline passes; then asserts
/// that nothing was refused and nothing granted went unused.
async fn assert_uses_exactly(user: &str, granted: &[audit::Permission]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let requests = loop {
        let requests = audit::requests_by(user);
        if audit::unused(granted, &requests).is_empty() || tokio::time::Instant::now() > deadline {
            break requests;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        !requests.is_empty(),
        "the audit log has no request of {user}"
    );
    let refused = audit::forbidden(&requests);
    assert!(
        refused.is_empty(),
        "{user} lacks permissions it needs; refused:\n  {}",
        refused.join("\n  ")
    );
    let unused = audit::unused(granted, &requests);
    assert!(
        unused.is_empty(),
        "{user} is granted permissions it never used:\n{}",
        audit::table(&unused)
    );
    eprintln!(
        "{user} used every permission it holds:\n{}",
        audit::table(granted)
    );
}

#[tokio::test]
async fn the_operator_needs_every_permission_the_chart_grants_and_no_other() {
    let _serial = OPERATORS.lock().await;
    audit::log_path();
    let home = TestNamespace::new("chart-op").await;
    let work = TestNamespace::new("chart-op-work").await;
    // The harness applied crds/ and deploy/admission/ with kubectl already.
    let release = Release::install(
        &home.name,
        &["crds.enabled=false", "admissionPolicies.enabled=false"],
    );
    let manifest = release.manifest();
    let deployment = find(&manifest, "Deployment", &release.object("operator"));
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName")
        .to_string();
    let user = audit::service_account_user(&home.name, &sa);
    wait_bindings_in_force(
        &user,
        &[
            ("watch", "fencedleases.fencing.dev", None),
            ("update", "leases.coordination.k8s.io", Some(&home.name)),
        ],
    );

    // The chart's own ServiceAccount, through a token from the TokenRequest API.
    let kubeconfig = home.service_account_kubeconfig(&sa);
    let op = ChartOperator::start(deployment, &home.name, "operator-0", &kubeconfig);
    op.wait_probes_pass(deployment).await;
    explain_failure(&user, core_scenario(&work, &release.fullname)).await;

    let granted = audit::granted_to(&home.name, &sa);
    assert!(
        granted.iter().any(|p| p.namespace.is_none()),
        "cluster-wide by default: a ClusterRoleBinding"
    );
    assert_uses_exactly(&user, &granted).await;
    drop(op);
}

/// Installed as an on-call team would: three watched namespaces, with the alerts, the
/// ServiceMonitor and the dashboard.
#[tokio::test]
async fn limited_to_listed_namespaces_the_operator_serves_them_through_role_bindings() {
    let _serial = OPERATORS.lock().await;
    audit::log_path();
    let home = TestNamespace::new("chart-ns").await;
    let mut served = Vec::new();
    for prefix in ["chart-ns-a", "chart-ns-b", "chart-ns-c"] {
        served.push(TestNamespace::new(prefix).await);
    }
    let other = TestNamespace::new("chart-ns-other").await;
    let mut set = vec![
        "crds.enabled=false".to_string(),
        "admissionPolicies.enabled=false".to_string(),
    ];
    for (i, ns) in served.iter().enumerate() {
        set.push(format!("watchNamespaces[{i}]={}", ns.name));
    }
    set.extend(monitoring::ENABLED.map(String::from));
    monitoring::install_crds();
    let set: Vec<&str> = set.iter().map(String::as_str).collect();
    let release = Release::install(&home.name, &set);
    monitoring::assert_installed(&release, 15);
    let manifest = release.manifest();
    let deployment = find(&manifest, "Deployment", &release.object("operator"));
    let sa = release.object("operator");
    let granted = audit::granted_to(&home.name, &sa);
    // Cluster-wide only what is cluster-scoped: the admission bindings of fenced leases, and
    // `get` of FencedLeases, which the apiserver requires of whoever creates a policy with
    // FencedLease params (a lease's kinds policy).
    let mut namespaces: Vec<&String> = served.iter().map(|ns| &ns.name).collect();
    namespaces.push(&home.name);
    assert!(
        granted.iter().all(|p| {
            p.namespace
                .as_ref()
                .is_some_and(|ns| namespaces.contains(&ns))
                || p.group == "admissionregistration.k8s.io"
                || (p.group == "fencing.dev" && p.resource == "fencedleases" && p.verb == "get")
        }),
        "nothing namespaced cluster-wide, only the release's and the three served namespaces:\n{}",
        audit::table(&granted)
    );
    let user = audit::service_account_user(&home.name, &sa);
    let mut checks: Vec<(&str, &str, Option<&str>)> = served
        .iter()
        .map(|ns| ("watch", "fencedleases.fencing.dev", Some(ns.name.as_str())))
        .collect();
    checks.push(("update", "leases.coordination.k8s.io", Some(&home.name)));
    wait_bindings_in_force(&user, &checks);
    // A claim in a namespace it does not serve, made first: it must still be untouched after
    // the served namespaces' leases have changed hands.
    create_fenced_lease(&other, "l", 15);
    other.create_claim("a", "l", None).await;
    let kubeconfig = home.service_account_kubeconfig(&sa);
    let op = ChartOperator::start(deployment, &home.name, "operator-0", &kubeconfig);
    op.wait_probes_pass(deployment).await;

    for ns in &served {
        explain_failure(&user, grant_and_release(ns)).await;
    }
    let claim = other.api::<FencedLeaseClaim>().get("a").await.unwrap();
    assert!(claim.status.is_none(), "{:?}", claim.status);
    let refused = audit::forbidden(&audit::requests_by(&user));
    assert!(refused.is_empty(), "refused:\n  {}", refused.join("\n  "));
    drop(op);
}

#[tokio::test]
async fn the_holder_cluster_role_is_all_kubectl_fence_and_the_library_need() {
    let _serial = OPERATORS.lock().await;
    audit::log_path();
    let home = TestNamespace::new("chart-holder").await;
    let work = TestNamespace::new("chart-holder-work").await;
    // The harness applied crds/ and deploy/admission/ with kubectl already.
    let release = Release::install(
        &home.name,
        &["crds.enabled=false", "admissionPolicies.enabled=false"],
    );
    let _operator = OperatorProcess::start(&work.name, &[]);

    // What the README and NOTES tell a user to do.
    let _ = work.client_as_service_account("worker").await;
    let role = release.object("holder");
    run_ok(work.kubectl().args([
        "create",
        "rolebinding",
        "worker-fence-holder",
        &format!("--clusterrole={role}"),
        &format!("--serviceaccount={}:worker", work.name),
    ]));
    let user = audit::service_account_user(&work.name, "worker");
    wait_bindings_in_force(
        &user,
        &[("create", "fencedleaseclaims.fencing.dev", Some(&work.name))],
    );
    let kubeconfig = work.service_account_kubeconfig("worker");
    work.create_lease("db", 3);

    let fence = |args: &[&str]| {
        let out = Command::new(common::bin("kubectl-fence"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()
            .expect("kubectl fence");
        assert!(
            out.status.success(),
            "kubectl fence {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let first: i64 = fence(&[
        "run",
        "db",
        "--wait",
        "30s",
        "--",
        "sh",
        "-c",
        "sleep 2; echo \"$FENCE_TOKEN\"",
    ])
    .parse()
    .expect("run prints the token");
    let second: i64 = fence(&["acquire", "db", "--wait", "30s"])
        .parse()
        .expect("a token");
    assert!(second > first, "tokens grow: {first} then {second}");
    fence(&["status", "db"]);
    fence(&["list"]);
    fence(&["release", "db", "--all"]);
    report_two_refusals(&kubeconfig, &work.name).await;

    let granted = audit::granted_to(&work.name, "worker");
    assert_uses_exactly(&user, &granted).await;
}

/// What the Rust library does with a guard's refusals under the holder role: acquires `db`,
/// and reports two refusals of its writes (a guard's errors as the PostgreSQL and Redis fences
/// return them; tests/chart/reported.rs has real ones): an Event created, then its series
/// updated.
async fn report_two_refusals(kubeconfig: &std::path::Path, namespace: &str) {
    use fenced_lease::holder::{AcquireOptions, acquire};
    let client = common::client_from_kubeconfig(kubeconfig).await;
    let options = AcquireOptions::default().wait(WAIT);
    let guard = acquire(client, namespace, "db", options)
        .await
        .expect("acquire db");
    let token = guard.token().expect("held");
    for highest in [token + 1, token + 2] {
        let refused = fenced_lease::fence::Error::Fenced {
            scope: Some("db".into()),
            presented: token,
            highest,
        };
        assert!(guard.refusal(&refused).is_some());
        guard.reported().await;
    }
    guard.release().await.expect("release db");
}
