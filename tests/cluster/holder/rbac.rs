//! The documented holder Role (deploy/rbac/holder-role.yaml) is all a holder needs: a
//! ServiceAccount bound to it alone can acquire, renew, release and `kubectl fence run`;
//! without it, the library says Forbidden and the CLI exits 77.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::TestNamespace;
use common::operator::OperatorProcess;
use fenced_lease::holder::{AcquireOptions, Error, acquire};

#[tokio::test]
async fn the_holder_role_is_enough_for_everything_a_holder_does() {
    let ns = TestNamespace::new("holder-rbac").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 3);
    let kubeconfig = ns.holder_service_account_kubeconfig("worker", true).await;
    let client = common::client_from_kubeconfig(&kubeconfig).await;

    let guard = acquire(
        client.clone(),
        &ns.name,
        "db",
        AcquireOptions::default()
            .identity("worker")
            .wait(Duration::from_secs(30)),
    )
    .await
    .expect("acquire with the holder role");
    let token = guard.token().expect("held");
    // Hold across several lease durations: renewals work under the role.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(guard.token().expect("still held after renewals"), token);
    guard.release().await.expect("release with the holder role");

    let out = Command::new(common::bin("kubectl-fence"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "run",
            "db",
            "--wait",
            "30s",
            "--",
            "sh",
            "-c",
            "echo \"$FENCE_TOKEN\"",
        ])
        .output()
        .expect("kubectl fence run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let next: i64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("run prints the token");
    assert!(next > token, "{next} after {token}");
    for args in [&["status", "db"][..], &["list"]] {
        let out = Command::new(common::bin("kubectl-fence"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()
            .expect("kubectl fence");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test]
async fn without_the_role_a_holder_is_told_it_is_forbidden() {
    let ns = TestNamespace::new("holder-norbac").await;
    ns.create_lease("db", 3);
    let kubeconfig = ns
        .holder_service_account_kubeconfig("stranger", false)
        .await;
    let client = common::client_from_kubeconfig(&kubeconfig).await;
    let err = acquire(
        client,
        &ns.name,
        "db",
        AcquireOptions::default().wait(Duration::from_secs(5)),
    )
    .await
    .expect_err("no permissions");
    assert!(matches!(err, Error::Forbidden { .. }), "{err:?}");

    let out = Command::new(common::bin("kubectl-fence"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["run", "db", "--wait", "5s", "--", "true"])
        .output()
        .expect("kubectl fence run");
    assert_eq!(
        out.status.code(),
        Some(77),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
