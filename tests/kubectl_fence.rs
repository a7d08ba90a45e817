//! `kubectl fence` as a user runs it, against a real apiserver and the operator: two `run`s
//! on one lease take turns with consecutive tokens; a stopped holder is replaced and its
//! command stopped when it resumes; `acquire`/`release`/`status`/`list` and the exit codes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::operator::OperatorProcess;
use common::{TestNamespace, wait_for};

const WAIT: Duration = Duration::from_secs(30);

fn fence(ns: &TestNamespace) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kubectl-fence"));
    cmd.arg("--kubeconfig")
        .arg(ns.admin_kubeconfig())
        .args(["-n", &ns.name]);
    cmd
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn scratch(ns: &TestNamespace, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(&ns.name);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(name)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

async fn wait_until_file_has(path: &Path, text: &str) {
    wait_for(
        &format!("{} to contain {text:?}", path.display()),
        WAIT,
        || async { read(path).contains(text).then_some(()) },
    )
    .await;
}

async fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "kubectl fence still running after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn two_runs_on_one_lease_take_turns_with_growing_tokens() {
    let ns = TestNamespace::new("fence-run").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db-migrate", 5);
    let log = scratch(&ns, "log");
    let script = format!(
        "echo \"start $FENCE_TOKEN $FENCE_HOLDER\" >> {log}; sleep 1; echo \"end $FENCE_TOKEN $FENCE_HOLDER\" >> {log}",
        log = log.display()
    );
    let run = |who: &str| {
        fence(&ns)
            .args([
                "run",
                "db-migrate",
                "--wait",
                "30s",
                "--identity",
                who,
                "--",
            ])
            .args(["sh", "-c", &script])
            .spawn()
            .expect("kubectl fence run")
    };
    let mut first = run("first");
    wait_until_file_has(&log, "start").await;
    let mut second = run("second");
    assert!(wait_exit(&mut first, WAIT).await.success());
    assert!(wait_exit(&mut second, WAIT).await.success());

    let lines: Vec<String> = read(&log).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    let token_of = |line: &str| -> i64 {
        line.split_whitespace()
            .nth(1)
            .and_then(|t| t.parse().ok())
            .expect("token")
    };
    let (first_token, second_token) = (token_of(&lines[0]), token_of(&lines[2]));
    assert!(second_token > first_token, "{lines:?}");
    assert_eq!(
        lines,
        [
            format!("start {first_token} first"),
            format!("end {first_token} first"),
            format!("start {second_token} second"),
            format!("end {second_token} second"),
        ],
        "the runs overlapped or were out of order"
    );
}

#[tokio::test]
async fn a_stopped_holder_is_replaced_and_its_command_stopped_when_it_resumes() {
    let ns = TestNamespace::new("fence-sigstop").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 2);
    let pidfile = scratch(&ns, "cmd.pid");
    let mut stalled = fence(&ns)
        .args(["run", "db", "--wait", "30s", "--grace", "1s", "--"])
        .args([
            "sh",
            "-c",
            &format!("echo $$ > {}; exec sleep 600", pidfile.display()),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl fence run");
    wait_until_file_has(&pidfile, "\n").await;
    let cmd_pid = read(&pidfile).trim().to_string();
    let token: i64 = {
        let out = fence(&ns)
            .args(["status", "db", "-o", "json"])
            .output()
            .expect("status");
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        status["token"].as_i64().expect("token")
    };

    kill(&stalled.id().to_string(), "STOP");
    let stopped_at = Instant::now();
    let next = fence(&ns)
        .args([
            "run",
            "db",
            "--wait",
            "30s",
            "--",
            "sh",
            "-c",
            "echo $FENCE_TOKEN",
        ])
        .output()
        .expect("second run");
    let replaced_after = stopped_at.elapsed();
    assert!(
        next.status.success(),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
    let next_token: i64 = stdout(&next).trim().parse().expect("token");
    assert!(next_token > token, "{next_token} after {token}");
    eprintln!("MEASURED stopped holder replaced after {replaced_after:?} (lease 2s)");

    assert!(
        alive(&cmd_pid),
        "the stopped holder's command ran on while it was stopped"
    );
    let resumed_at = Instant::now();
    kill(&stalled.id().to_string(), "CONT");
    let status = wait_exit(&mut stalled, Duration::from_secs(10)).await;
    let stopped_after = resumed_at.elapsed();
    eprintln!(
        "MEASURED resumed `kubectl fence run` stopped its command and exited {stopped_after:?} after SIGCONT"
    );
    assert_eq!(status.code(), Some(76), "exit code for a lost lease");
    assert!(stopped_after < Duration::from_secs(3), "{stopped_after:?}");
    wait_for("the command to be gone", Duration::from_secs(5), || async {
        (!alive(&cmd_pid)).then_some(())
    })
    .await;
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut stalled.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert!(stderr.contains("lost db"), "{stderr}");
}

#[tokio::test]
async fn acquire_prints_the_token_and_release_frees_the_lease() {
    let ns = TestNamespace::new("fence-acquire").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 30);

    let out = fence(&ns)
        .args(["acquire", "db", "--wait", "30s", "--identity", "script"])
        .output()
        .expect("acquire");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token: i64 = stdout(&out)
        .trim()
        .parse()
        .expect("acquire prints the token");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // It says how to release exactly this claim.
    let claim = stderr
        .split("`kubectl fence release db ")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .unwrap_or_else(|| panic!("no release hint: {stderr}"))
        .to_string();

    let out = fence(&ns).args(["status", "db"]).output().expect("status");
    let text = stdout(&out);
    assert!(text.contains(&format!("Token:     {token}")), "{text}");
    assert!(text.contains("Holder:    script"), "{text}");

    // Held: a second acquire gives up after --wait with the documented code.
    let started = Instant::now();
    let out = fence(&ns)
        .args(["acquire", "db", "--wait", "1s", "--identity", "other"])
        .output()
        .expect("acquire");
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    let out = fence(&ns)
        .args(["release", "db", &claim])
        .output()
        .expect("release");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout(&out).contains(&format!("(token {token})")),
        "{}",
        stdout(&out)
    );

    let out = fence(&ns)
        .args(["list", "-o", "json"])
        .output()
        .expect("list");
    let leases: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(leases[0]["name"], "db");
    assert_eq!(leases[0]["token"], token);
    assert!(leases[0].get("holder").is_none(), "{leases}");

    let out = fence(&ns)
        .args(["list", "-o", "yaml"])
        .output()
        .expect("list");
    assert!(stdout(&out).contains("name: db"), "{}", stdout(&out));
}

#[tokio::test]
async fn exit_codes_say_what_went_wrong() {
    let ns = TestNamespace::new("fence-codes").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 5);

    let out = fence(&ns)
        .args(["run", "missing", "--wait", "5s", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));

    let out = fence(&ns)
        .args(["run", "db", "--wait", "30s", "--", "sh", "-c", "exit 3"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(3), "CMD's own code");

    let out = fence(&ns)
        .args(["run", "db", "--wait", "30s", "--", "/no/such/command"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(127));

    let out = fence(&ns).args(["run", "db"]).output().expect("run");
    assert_eq!(out.status.code(), Some(2), "no command is a usage error");

    // Every run released its claim: nothing is left queued or holding.
    let out = fence(&ns)
        .args(["status", "db", "-o", "json"])
        .output()
        .expect("status");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(status.get("holder").is_none(), "{status}");
    assert_eq!(status["waiting"], serde_json::json!([]));
}

#[test]
fn every_command_has_help_with_an_example() {
    for command in ["status", "list", "acquire", "release", "run"] {
        let out = Command::new(env!("CARGO_BIN_EXE_kubectl-fence"))
            .args([command, "--help"])
            .output()
            .expect("help");
        assert!(out.status.success());
        let help = stdout(&out);
        assert!(help.contains("kubectl fence"), "{command}: {help}");
        if matches!(command, "run" | "acquire") {
            assert!(help.contains("76"), "{command} --help documents exit codes");
        }
    }
}

fn kill(pid: &str, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), pid])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{sig} {pid}");
}

fn alive(pid: &str) -> bool {
    Command::new("kill")
        .args(["-0", pid])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
