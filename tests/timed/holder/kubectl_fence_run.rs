//! `kubectl fence run` treats CMD like flock(1) and `timeout --foreground` do: the lease is
//! released only once CMD's whole process group is gone (or, with --kill-group, stopped);
//! CMD cannot outlive `kubectl fence`; an interactive CMD gets the terminal; Ctrl-Z stops CMD
//! and `kubectl fence` both; the signals a shell or a supervisor sends are passed on; and the
//! exit codes follow the shell's 128 + N.

use crate::common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::cli::{
    alive, both, fence, kill, pid_from, read, scratch, spawn_logged, wait_exit, wait_state,
    wait_until_file_has,
};
use common::operator::OperatorProcess;
use common::{TestNamespace, wait_for};

const WAIT: Duration = Duration::from_secs(30);

/// CMD exits at once, leaving a background job in its process group: the lease is held until
/// that job has ended too, so the next holder starts after it.
#[tokio::test]
async fn the_lease_is_held_until_cmds_whole_process_group_is_gone() {
    let ns = TestNamespace::new("run-group").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 15);
    let log = scratch(&ns, "log");
    let first_log = scratch(&ns, "first.stderr");
    let mut first = spawn_logged(
        {
            let mut c = fence(&ns);
            c.args(["run", "db", "--wait", "30s", "--identity", "first", "--"])
                .args([
                    "sh",
                    "-c",
                    &format!(
                        "(sleep 2; echo background-done >> {log}) & echo cmd-done >> {log}",
                        log = log.display()
                    ),
                ]);
            c
        },
        &first_log,
    );
    wait_until_file_has(&log, "cmd-done", WAIT).await;
    let mut second = fence(&ns)
        .args(["run", "db", "--wait", "30s", "--identity", "second", "--"])
        .args(["sh", "-c", &format!("echo next >> {}", log.display())])
        .spawn()
        .expect("second run");
    assert!(
        wait_exit(&mut first, WAIT).await.success(),
        "{}",
        read(&first_log)
    );
    assert!(wait_exit(&mut second, WAIT).await.success());
    assert_eq!(
        read(&log),
        "cmd-done\nbackground-done\nnext\n",
        "the lease went to the next holder while CMD's background job still ran"
    );
    assert!(
        read(&first_log).contains("until the processes it left in its group end"),
        "{}",
        read(&first_log)
    );
}

/// With --kill-group, what CMD leaves behind is stopped when CMD exits, and the run ends with
/// CMD's own code.
#[tokio::test]
async fn kill_group_stops_what_cmd_leaves_behind() {
    let ns = TestNamespace::new("run-killgroup").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 15);
    let pidfile = scratch(&ns, "bg.pid");
    let started = Instant::now();
    let out = fence(&ns)
        .args([
            "run",
            "db",
            "--wait",
            "30s",
            "--kill-group",
            "--grace",
            "1s",
            "--",
        ])
        .args([
            "sh",
            "-c",
            &format!("sleep 600 & echo $! > {}; exit 3", pidfile.display()),
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(3), "{}", both(&out));
    let background: u32 = read(&pidfile).trim().parse().expect("pid");
    assert!(!alive(background), "the background job survived");
    assert!(started.elapsed() < Duration::from_secs(20));
}

/// CMD cannot outlive `kubectl fence`: SIGKILL it (an OOM kill, say) and CMD is killed too,
/// instead of running on without a lease.
#[tokio::test]
async fn cmd_dies_with_kubectl_fence() {
    let ns = TestNamespace::new("run-pdeathsig").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 15);
    let pidfile = scratch(&ns, "cmd.pid");
    let mut run = fence(&ns)
        .args(["run", "db", "--wait", "30s", "--"])
        .args([
            "sh",
            "-c",
            &format!("echo $$ > {}; exec sleep 600", pidfile.display()),
        ])
        .spawn()
        .expect("run");
    let cmd = pid_from(&pidfile).await;
    assert!(alive(cmd));
    kill(run.id(), "KILL");
    let _ = run.wait();
    wait_state(cmd, None, Duration::from_secs(5)).await;
}

/// Signals sent to `kubectl fence` reach CMD, each one, however fast they come; the run ends
/// with 128 + N when a signal N ends CMD.
#[tokio::test]
async fn signals_are_passed_on_to_cmd_and_the_exit_code_is_128_plus_n() {
    let ns = TestNamespace::new("run-signals").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 15);
    let log = scratch(&ns, "log");
    let script = format!(
        "trap 'echo usr1 >> {log}' USR1; trap 'echo hup >> {log}' HUP; echo ready >> {log}; while :; do sleep 0.05; done",
        log = log.display()
    );
    let mut run = fence(&ns)
        .args(["run", "db", "--wait", "30s", "--", "sh", "-c", &script])
        .spawn()
        .expect("run");
    wait_until_file_has(&log, "ready", WAIT).await;
    for n in 1..=3 {
        kill(run.id(), "USR1");
        wait_for(&format!("USR1 number {n} to reach CMD"), WAIT, || async {
            (read(&log).matches("usr1").count() == n).then_some(())
        })
        .await;
        kill(run.id(), "HUP");
        wait_for(&format!("HUP number {n} to reach CMD"), WAIT, || async {
            (read(&log).matches("hup").count() == n).then_some(())
        })
        .await;
    }
    kill(run.id(), "TERM");
    let status = wait_exit(&mut run, WAIT).await;
    assert_eq!(status.code(), Some(143), "SIGTERM ended CMD: 128 + 15");
}

/// A signal that ends the wait for the lease ends `kubectl fence` with 128 + N (not 130 for
/// all), and withdraws its claim.
#[tokio::test]
async fn sigterm_while_waiting_exits_143_and_withdraws_the_claim() {
    let ns = TestNamespace::new("run-wait-term").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 15);
    let held = fence(&ns)
        .args(["acquire", "db", "--wait", "30s", "--identity", "holder"])
        .output()
        .expect("acquire");
    assert!(held.status.success(), "{}", both(&held));
    let mut waiter = fence(&ns)
        .args(["run", "db", "--identity", "waiter", "--", "true"])
        .spawn()
        .expect("run");
    let claims: kube::Api<fenced_lease::api::FencedLeaseClaim> = ns.api();
    let waiting = || async {
        claims
            .list(&Default::default())
            .await
            .ok()
            .map(|l| l.items.iter().any(|c| c.spec.holder_identity == "waiter"))
    };
    wait_for("the waiter to queue", WAIT, || async {
        waiting().await.filter(|w| *w).map(|_| ())
    })
    .await;
    kill(waiter.id(), "TERM");
    let status = wait_exit(&mut waiter, WAIT).await;
    assert_eq!(status.code(), Some(143));
    assert_eq!(
        waiting().await,
        Some(false),
        "the waiter's claim was left behind"
    );
}

/// Ctrl-Z when CMD does not have the terminal (stdin redirected): the shell's SIGTSTP reaches
/// `kubectl fence`, which stops CMD's group and then itself; `fg` (SIGCONT) continues both.
/// For bash as CMD: a SIGINT ends it by SIGINT even when it lands as a child exits on its own.
const SIGINT_KILLS: &str = "trap 'trap - INT; kill -INT $$' INT; ";

#[tokio::test]
async fn ctrl_z_stops_cmd_and_kubectl_fence_and_fg_continues_both() {
    let ns = TestNamespace::new("run-tstp").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 60);
    let pidfile = scratch(&ns, "cmd.pid");
    let ticks = scratch(&ns, "ticks");
    let mut run = fence(&ns)
        .args(["run", "db", "--wait", "30s", "--"])
        .args([
            // bash, not dash: dash vforks `sleep` with every signal blocked, and a SIGTSTP
            // landing in that window stops the child before its exec while dash waits on it,
            // never stopped itself (seen 1 run in 8 under load; the same in any job control).
            // The trap: a SIGINT that reaches bash just after `sleep` exited on its own, before
            // bash reaped it, is one bash takes as handled by the child, and it loops on
            // (its "wait and cooperative exit"; seen once in a clean-clone run). With the trap
            // bash dies of the SIGINT all the same, once `sleep` is reaped.
            "bash",
            "-c",
            &format!(
                "{SIGINT_KILLS}echo $$ > {}; while :; do echo tick >> {}; sleep 0.05; done",
                pidfile.display(),
                ticks.display()
            ),
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("run");
    let cmd = pid_from(&pidfile).await;
    kill(run.id(), "TSTP");
    wait_state(cmd, Some('T'), WAIT).await;
    wait_state(run.id(), Some('T'), WAIT).await;
    let before = read(&ticks).len();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(read(&ticks).len(), before, "CMD ran on while stopped");

    kill(run.id(), "CONT");
    wait_state(cmd, Some('S'), WAIT).await;
    wait_for("CMD to run again", WAIT, || async {
        (read(&ticks).len() > before).then_some(())
    })
    .await;
    kill(run.id(), "INT");
    let status = wait_exit(&mut run, WAIT).await;
    assert_eq!(status.code(), Some(130), "SIGINT ended CMD: 128 + 2");
}

/// `kubectl fence run` on a terminal, under script(1): CMD gets the terminal, so an
/// interactive CMD can read it (instead of being stopped by SIGTTIN); Ctrl-Z typed on the
/// terminal stops CMD and `kubectl fence`, `fg` continues them, Ctrl-C ends CMD with 130.
#[tokio::test]
async fn on_a_terminal_cmd_gets_it_and_ctrl_z_and_ctrl_c_work() {
    let ns = TestNamespace::new("run-tty").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 60);
    let answer = scratch(&ns, "answer");
    let pidfile = scratch(&ns, "cmd.pid");
    let fence_pidfile = scratch(&ns, "fence.pid");
    let ticks = scratch(&ns, "ticks");
    // bash, not dash: see ctrl_z_stops_cmd_and_kubectl_fence_and_fg_continues_both.
    let cmd = format!(
        "{SIGINT_KILLS}printf 'continue? '; read reply; echo \"$reply\" > {answer}; echo $$ > {pid}; while :; do echo tick >> {ticks}; sleep 0.05; done",
        answer = answer.display(),
        pid = pidfile.display(),
        ticks = ticks.display()
    );
    let fence_cmd = format!(
        "echo $$ > {fence_pid}; exec {bin} --kubeconfig {kc} -n {ns} run db --wait 30s -- bash -c {cmd}",
        fence_pid = fence_pidfile.display(),
        bin = common::bin("kubectl-fence").display(),
        kc = ns.admin_kubeconfig().display(),
        ns = ns.name,
        cmd = shell_quote(&cmd),
    );
    // script(1) runs the command on a new pseudo-terminal and copies its own stdin to it.
    let mut script = Command::new("script")
        .args(["-q", "-f", "-e", "-c", &fence_cmd, "/dev/null"])
        .env("SHELL", "/bin/sh")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("script(1) (util-linux) is needed for terminal tests");
    let mut terminal = script.stdin.take().expect("stdin");
    let fence_pid = pid_from(&fence_pidfile).await;
    // The prompt is on the terminal: answer it.
    let prompt_rx = prompted(script.stdout.take().expect("stdout"));
    tokio::task::spawn_blocking(move || prompt_rx.recv_timeout(WAIT))
        .await
        .expect("join")
        .expect("CMD prompts on the terminal");
    terminal.write_all(b"yes\n").expect("type");
    wait_until_file_has(&answer, "yes", WAIT).await;
    let cmd_pid = pid_from(&pidfile).await;

    // Ctrl-Z on the terminal.
    terminal.write_all(b"\x1a").expect("type Ctrl-Z");
    wait_state(cmd_pid, Some('T'), WAIT).await;
    wait_state(fence_pid, Some('T'), WAIT).await;
    let before = read(&ticks).len();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(read(&ticks).len(), before, "CMD ran on while stopped");

    // `fg`: script(1) stopped itself with its child; continuing it continues the child.
    kill(script.id(), "CONT");
    kill(fence_pid, "CONT");
    wait_state(cmd_pid, Some('S'), WAIT).await;
    wait_for("CMD to run again", WAIT, || async {
        (read(&ticks).len() > before).then_some(())
    })
    .await;

    terminal.write_all(b"\x03").expect("type Ctrl-C");
    let status = wait_exit(&mut script, WAIT).await;
    assert_eq!(status.code(), Some(130), "Ctrl-C ended CMD: 128 + 2");
}

/// Reads the terminal's output (script(1)'s stdout) to its end; says so each time it has
/// shown the prompt `continue?`.
fn prompted(mut stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<()> {
    let (prompt_tx, prompt_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok(n) = std::io::Read::read(&mut stdout, &mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&seen).contains("continue?") {
                let _ = prompt_tx.send(());
            }
        }
    });
    prompt_rx
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
