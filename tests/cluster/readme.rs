//! The README's examples are copied from here, and run here: a test fails when the README
//! and the code that runs drift apart.

use crate::common;

use std::time::Duration;

use common::operator::OperatorProcess;
use common::{TestNamespace, repo_root, wait_for};

fn readme() -> String {
    std::fs::read_to_string(repo_root().join("README.md")).expect("README.md")
}

/// The lines between `// README: rust` and `// README: end` in this file, unindented.
fn rust_example() -> String {
    let source = std::fs::read_to_string(repo_root().join("tests/cluster/readme.rs")).unwrap();
    let start = source.find("// README: rust\n").expect("start marker") + "// README: rust\n".len();
    let end = source[start..].find("// README: end").expect("end marker") + start;
    source[start..end]
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .map(|l| format!("{}\n", l.trim_end()))
        .collect::<String>()
        .trim_end()
        .to_string()
}

#[tokio::test]
async fn readme_rust_example_runs() -> Result<(), fenced_lease::holder::Error> {
    let example = rust_example();
    assert!(
        example.lines().count() <= 15,
        "the README example grew past 15 lines:\n{example}"
    );
    assert!(
        readme().contains(&example),
        "README.md does not show the example of tests/cluster/readme.rs:\n{example}"
    );

    let ns = TestNamespace::new("readme-rust").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db-migrate", 15);
    let (client, namespace) = (ns.holder_client().await, ns.name.as_str());

    // README: rust
    use fenced_lease::holder::{AcquireOptions, acquire};
    use std::time::Duration;

    let options = AcquireOptions::default().wait(Duration::from_secs(30));
    let guard = acquire(client, namespace, "db-migrate", options).await?;
    let token = guard.token()?; // refuses once the lease may have been lost
    // Send it with every write: UPDATE ... WHERE id = $1 AND fence_token <= $token
    println!("holding db-migrate with token {token}");
    tokio::select! {
        reason = guard.lost() => eprintln!("lost the lease ({reason:?}): stop writing"),
        () = tokio::time::sleep(Duration::from_millis(200)) => {} // the work
    }
    guard.release().await?; // the next waiter is granted at once
    // README: end

    assert!(token > 0);
    Ok(())
}

#[tokio::test]
async fn readme_kubectl_fence_run_example_runs() {
    let readme = readme();
    let command = readme
        .lines()
        .find_map(|l| l.strip_prefix("$ kubectl fence run "))
        .map(|rest| format!("kubectl fence run {rest}"))
        .expect("the README shows `$ kubectl fence run ...`");

    let ns = TestNamespace::new("readme-run").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db-migrate", 15);
    let kubeconfig = ns.holder_service_account_kubeconfig("worker", true).await;
    // `kubectl fence` finds the plugin on PATH, as it would for a user.
    let plugin_dir = common::bin("kubectl-fence").parent().unwrap().to_path_buf();
    let kubectl_dir = common::control_plane()
        .kubectl
        .parent()
        .unwrap()
        .to_path_buf();
    let path = std::env::join_paths([plugin_dir, kubectl_dir].into_iter().chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let output = wait_for(
        "the README's kubectl fence run to succeed",
        Duration::from_secs(60),
        || async {
            let out = tokio::process::Command::new("sh")
                .args(["-c", &command])
                .env("PATH", &path)
                .env("KUBECONFIG", &kubeconfig)
                .output()
                .await
                .ok()?;
            out.status.success().then_some(out)
        },
    )
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let token = stdout
        .trim()
        .strip_prefix("holding db-migrate with token ")
        .and_then(|t| t.parse::<i64>().ok());
    assert!(
        token.is_some_and(|t| t > 0),
        "output of `{command}`:\n{stdout}"
    );
}

#[test]
fn readme_opens_with_make_demo_and_the_makefile_has_it() {
    let readme = readme();
    let first_command = readme
        .lines()
        .find_map(|l| l.strip_prefix("$ "))
        .expect("the README shows a command");
    assert_eq!(first_command, "make demo", "the README's first command");
    let makefile = std::fs::read_to_string(repo_root().join("Makefile")).unwrap();
    assert!(
        makefile.lines().any(|l| l.starts_with("demo:")),
        "the Makefile has no demo target"
    );
    assert!(
        readme.contains("OK: the dividend was paid once."),
        "the README shows the output of a successful demo"
    );
}

/// Every alert links its runbook, and the link lands on a section of docs/runbooks.md, which
/// the README points to.
#[test]
fn every_alert_has_a_runbook_section() {
    let root = repo_root();
    let alerts = std::fs::read_to_string(root.join("deploy/monitoring/alerts.yaml")).unwrap();
    let runbooks = std::fs::read_to_string(root.join("docs/runbooks.md")).unwrap();
    let names: Vec<&str> = alerts
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(names.len() >= 7, "alerts: {names:?}");
    for name in names {
        let url = format!(
            "runbook_url: https://github.com/fenced-lease/fenced-lease/blob/main/docs/runbooks.md#{}",
            name.to_lowercase()
        );
        assert!(alerts.contains(&url), "{name} has no runbook_url {url}");
        assert!(
            runbooks.contains(&format!("\n## {name}\n")),
            "docs/runbooks.md has no section {name}"
        );
        assert!(
            readme().contains(&format!("(docs/runbooks.md#{})", name.to_lowercase())),
            "the README does not link the runbook of {name}"
        );
    }
}
