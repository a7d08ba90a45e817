//! `kubectl fence` as a user runs it, against a real apiserver and the operator: two `run`s
//! on one lease take turns with growing tokens; a stopped holder is replaced and its command
//! stopped when it resumes; `--wait 0`; `acquire`/`release`/`status`/`list`, kubectl's flags,
//! the exit codes (403 is 77, not a loss), and the claim owned by the pod it runs in.
//! How `run` treats CMD's process group, signals and the terminal: tests/timed/holder/kubectl_fence_run.rs.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cli::{alive, fence, kill, read, scratch, wait_exit};
use common::operator::OperatorProcess;
use common::{TestNamespace, wait_for};

const WAIT: Duration = Duration::from_secs(30);

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn wait_until_file_has(path: &std::path::Path, text: &str) {
    common::cli::wait_until_file_has(path, text, WAIT).await;
}

#[tokio::test]
async fn two_runs_on_one_lease_take_turns_with_growing_tokens() {
    let ns = TestNamespace::new("fence-run").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db-migrate", 5);
    let log = scratch(&ns, "log");
    let script = format!(
        "echo \"start $FENCE_TOKEN $FENCE_HOLDER $FENCE_SCOPE\" >> {log}; sleep 1; echo \"end $FENCE_TOKEN $FENCE_HOLDER\" >> {log}",
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
            format!("start {first_token} first {}/db-migrate", ns.name),
            format!("end {first_token} first"),
            format!("start {second_token} second {}/db-migrate", ns.name),
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
    let cmd_pid: u32 = read(&pidfile).trim().parse().expect("pid");
    let token: i64 = {
        let out = fence(&ns)
            .args(["status", "db", "-o", "json"])
            .output()
            .expect("status");
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        status["token"].as_i64().expect("token")
    };

    kill(stalled.id(), "STOP");
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
        alive(cmd_pid),
        "the stopped holder's command ran on while it was stopped"
    );
    let resumed_at = Instant::now();
    kill(stalled.id(), "CONT");
    let status = wait_exit(&mut stalled, Duration::from_secs(10)).await;
    let stopped_after = resumed_at.elapsed();
    eprintln!(
        "MEASURED resumed `kubectl fence run` stopped its command and exited {stopped_after:?} after SIGCONT"
    );
    assert_eq!(status.code(), Some(76), "exit code for a lost lease");
    assert!(stopped_after < Duration::from_secs(3), "{stopped_after:?}");
    wait_for("the command to be gone", Duration::from_secs(5), || async {
        (!alive(cmd_pid)).then_some(())
    })
    .await;
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut stalled.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert!(stderr.contains("lost db"), "{stderr}");
}

/// The claim `acquire`'s hint (on `stderr`) says to release: `kubectl fence release db CLAIM`.
fn release_hint(stderr: &str) -> String {
    stderr
        .split("`kubectl fence release db ")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .unwrap_or_else(|| panic!("no release hint: {stderr}"))
        .to_string()
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
    // It says how to release exactly this claim.
    let claim = release_hint(&String::from_utf8_lossy(&out.stderr));

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

    // The operator frees the lease a moment after the claim is gone.
    let leases = wait_for("the lease to be free", WAIT, || async {
        let out = fence(&ns)
            .args(["list", "-o", "json"])
            .output()
            .expect("list");
        let leases: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        leases[0].get("holder").is_none().then_some(leases)
    })
    .await;
    assert_eq!(leases[0]["name"], "db");
    assert_eq!(leases[0]["token"], token);

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

    // Every run released its claim: nothing is left queued or holding (the operator frees
    // the lease a moment after the last claim is gone).
    assert_eq!(claims_on(&ns, "db").await, []);
    wait_for("the lease to be free", WAIT, || async {
        let out = fence(&ns)
            .args(["status", "db", "-o", "json"])
            .output()
            .expect("status");
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        (status.get("holder").is_none() && status["waiting"] == serde_json::json!([])).then_some(())
    })
    .await;
}

#[test]
fn every_command_has_help_with_an_example() {
    for command in ["status", "list", "acquire", "release", "run"] {
        let out = Command::new(common::bin("kubectl-fence"))
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

/// Claims on `lease` in the test namespace: (name, identity, phase).
async fn claims_on(ns: &TestNamespace, lease: &str) -> Vec<(String, String, Option<String>)> {
    let api: kube::Api<fenced_lease::api::FencedLeaseClaim> = ns.api();
    api.list(&Default::default())
        .await
        .expect("list claims")
        .items
        .into_iter()
        .filter(|c| c.spec.lease_name == lease)
        .map(|c| {
            let phase = c
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .map(|p| format!("{p:?}"));
            (
                kube::ResourceExt::name_any(&c),
                c.spec.holder_identity,
                phase,
            )
        })
        .collect()
}

/// `--wait 0` is "take it if it is free" (flock -n), for CronJobs that skip a run while the
/// previous one still holds the lease: a free lease is taken every time, a held one is given
/// up at once with 75, leaving no claim behind.
#[tokio::test]
async fn wait_zero_takes_a_free_lease_and_gives_up_on_a_held_one_at_once() {
    let ns = TestNamespace::new("fence-wait0").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("nightly", 15);
    // The operator needs a moment to start; the first grant proves it is up.
    let out = fence(&ns)
        .args(["run", "nightly", "--wait", "30s", "--", "true"])
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", common::cli::both(&out));

    for attempt in 0..5 {
        let out = fence(&ns)
            .args([
                "run",
                "nightly",
                "--wait",
                "0",
                "--",
                "sh",
                "-c",
                "echo $FENCE_TOKEN",
            ])
            .output()
            .expect("run --wait 0");
        assert!(
            out.status.success(),
            "attempt {attempt} on a free lease: {}",
            common::cli::both(&out)
        );
        assert!(
            stdout(&out).trim().parse::<i64>().is_ok(),
            "{}",
            stdout(&out)
        );
    }

    let holder = fence(&ns)
        .args([
            "acquire",
            "nightly",
            "--wait",
            "30s",
            "--identity",
            "previous-run",
        ])
        .output()
        .expect("acquire");
    assert!(holder.status.success(), "{}", common::cli::both(&holder));
    let started = Instant::now();
    let out = fence(&ns)
        .args(["run", "nightly", "--wait", "0", "--identity", "skipped"])
        .args(["--", "sh", "-c", "echo ran"])
        .output()
        .expect("run --wait 0");
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(75), "{}", common::cli::both(&out));
    assert!(!stdout(&out).contains("ran"), "CMD ran on a held lease");
    eprintln!("MEASURED --wait 0 on a held lease gave up after {took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let left: Vec<_> = claims_on(&ns, "nightly")
        .await
        .into_iter()
        .filter(|(_, who, _)| who == "skipped")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `kubectl fence acquire db` as identity host-1: the claim's `-o name`.
fn acquire_as_host_1(ns: &TestNamespace) -> String {
    let out = fence(ns)
        .args([
            "acquire",
            "db",
            "--wait",
            "30s",
            "--identity",
            "host-1",
            "-o",
            "name",
        ])
        .output()
        .expect("acquire");
    assert!(out.status.success(), "{}", common::cli::both(&out));
    let acquired = stdout(&out).trim().to_string();
    assert!(
        acquired.starts_with("fencedleaseclaim.fencing.dev/db-"),
        "{acquired}"
    );
    acquired
}

/// `release` without a claim named is refused (exit 2); with `acquired` named it releases that
/// claim only.
fn release_names_its_claim(ns: &TestNamespace, acquired: &str) {
    let out = fence(ns).args(["release", "db"]).output().expect("release");
    assert_eq!(
        out.status.code(),
        Some(2),
        "no claim named: {}",
        common::cli::both(&out)
    );
    let out = fence(ns)
        .args(["release", "db", acquired])
        .output()
        .expect("release");
    assert!(out.status.success(), "{}", common::cli::both(&out));
    assert!(
        stdout(&out).contains("released claim db-"),
        "{}",
        stdout(&out)
    );
}

/// --all [--identity]: every claim (of that identity) on the lease.
async fn release_all_of_an_identity(ns: &TestNamespace) {
    for who in ["a", "b"] {
        let out = fence(ns)
            .args(["acquire", "db", "--wait", "0", "--identity", who])
            .output()
            .expect("acquire");
        if who == "a" {
            assert!(out.status.success(), "{}", common::cli::both(&out));
        }
    }
    let out = fence(ns)
        .args(["release", "db", "--all", "--identity", "a", "-o", "name"])
        .output()
        .expect("release --all");
    assert!(out.status.success(), "{}", common::cli::both(&out));
    assert!(
        stdout(&out).starts_with("fencedleaseclaim.fencing.dev/db-"),
        "{}",
        stdout(&out)
    );
    wait_for("a's claim to be gone", WAIT, || async {
        claims_on(ns, "db").await.is_empty().then_some(())
    })
    .await;
}

/// `release` deletes the claim it is told to, never another `run` of the same identity on
/// the same host; `--all` is there for the rest.
#[tokio::test]
async fn release_deletes_only_the_claim_it_is_told_to() {
    let ns = TestNamespace::new("fence-release").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 30);
    let acquired = acquire_as_host_1(&ns);

    // A `run` of the same identity waits behind it.
    let log = scratch(&ns, "log");
    let mut run = fence(&ns)
        .args(["run", "db", "--wait", "60s", "--identity", "host-1", "--"])
        .args(["sh", "-c", &format!("echo ran >> {}", log.display())])
        .spawn()
        .expect("run");
    wait_for("the run to queue", WAIT, || async {
        (claims_on(&ns, "db").await.len() == 2).then_some(())
    })
    .await;

    release_names_its_claim(&ns, &acquired);
    let status = wait_exit(&mut run, WAIT).await;
    assert!(
        status.success(),
        "the waiting run was released too: {status}"
    );
    assert_eq!(read(&log), "ran\n");
    release_all_of_an_identity(&ns).await;
}

/// kubectl's conventions: `-A` and `-o wide|name` on `list`, `--as` impersonates (and a 403
/// is exit 77), `--request-timeout` bounds every request.
#[tokio::test]
async fn list_all_namespaces_output_formats_impersonation_and_request_timeout() {
    let ns = TestNamespace::new("fence-kubectl").await;
    let other = TestNamespace::new("fence-kubectl-other").await;
    ns.create_lease("db", 15);
    other.create_lease("cache", 20);

    let out = fence(&ns)
        .args(["list", "-A", "-o", "wide"])
        .output()
        .expect("list");
    assert!(out.status.success(), "{}", common::cli::both(&out));
    let text = stdout(&out);
    let header = text.lines().next().unwrap_or_default();
    assert!(header.starts_with("NAMESPACE"), "{text}");
    assert!(header.contains("DURATION"), "{text}");
    for (namespace, lease, duration) in [(&ns.name, "db", "15s"), (&other.name, "cache", "20s")] {
        assert!(
            text.lines().any(|l| l.starts_with(namespace.as_str())
                && l.contains(lease)
                && l.contains(duration)),
            "{text}"
        );
    }

    let out = fence(&ns)
        .args(["list", "-o", "name"])
        .output()
        .expect("list");
    assert_eq!(stdout(&out), "fencedlease.fencing.dev/db\n");
    let out = fence(&ns)
        .args(["status", "db", "-o", "name"])
        .output()
        .expect("status");
    assert_eq!(stdout(&out), "fencedlease.fencing.dev/db\n");

    // Impersonating a ServiceAccount without the holder Role: forbidden, exit 77.
    let sa = format!("system:serviceaccount:{}:nobody", ns.name);
    let out = fence(&ns)
        .args(["status", "db", "--as", &sa])
        .output()
        .expect("status --as");
    assert_eq!(out.status.code(), Some(77), "{}", common::cli::both(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&sa),
        "the apiserver's message names the user: {}",
        common::cli::both(&out)
    );

    let out = fence(&ns)
        .args(["status", "db", "--request-timeout", "1ms"])
        .output()
        .expect("status");
    assert_eq!(out.status.code(), Some(69), "{}", common::cli::both(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no answer within 1ms"),
        "{}",
        common::cli::both(&out)
    );
}

/// A heartbeat refused with 403 (the holder's RoleBinding removed, or a policy that lets only
/// a claim's creator change it) ends the run with 77 and says so: it is not a loss to retry.
#[tokio::test]
async fn a_forbidden_heartbeat_stops_cmd_and_exits_77() {
    let ns = TestNamespace::new("fence-403").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 6);
    let kubeconfig = ns.holder_service_account_kubeconfig("worker", true).await;
    let pidfile = scratch(&ns, "cmd.pid");
    let mut run = common::cli::fence_as(&ns, &kubeconfig)
        .args(["run", "db", "--wait", "30s", "--grace", "1s", "--"])
        .args([
            "sh",
            "-c",
            &format!("echo $$ > {}; exec sleep 600", pidfile.display()),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    let cmd_pid = common::cli::pid_from(&pidfile).await;
    let out = ns
        .kubectl()
        .args(["delete", "rolebinding", "worker-holder"])
        .output()
        .expect("kubectl");
    assert!(out.status.success());
    let removed = Instant::now();
    let status = wait_exit(&mut run, WAIT).await;
    eprintln!(
        "MEASURED run ended {:?} after its RoleBinding was removed (lease 6s)",
        removed.elapsed()
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert_eq!(status.code(), Some(77), "{stderr}");
    assert!(stderr.contains("forbidden"), "{stderr}");
    assert!(!alive(cmd_pid), "CMD still runs");
}

/// I5: in a pod (downward API variables), the claim names the pod and is owned by it by
/// UID, so deleting the pod ends the hold (the garbage collector deletes the claim; the
/// operator revokes the grant), and the run stops CMD.
#[tokio::test]
async fn i5_in_a_pod_the_claim_is_owned_by_the_pod_and_its_deletion_ends_the_run() {
    use k8s_openapi::api::core::v1::Pod;
    let ns = TestNamespace::new("fence-pod").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 15);
    let pods: kube::Api<Pod> = ns.api();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "worker-0"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }))
    .unwrap();
    let pod = pods
        .create(&Default::default(), &pod)
        .await
        .expect("create pod");
    let uid = pod.metadata.uid.clone().expect("uid");
    let pidfile = scratch(&ns, "cmd.pid");
    let mut run = fence(&ns)
        .args(["run", "db", "--wait", "30s", "--grace", "1s", "--"])
        .args([
            "sh",
            "-c",
            &format!("echo $$ > {}; exec sleep 600", pidfile.display()),
        ])
        .env("POD_NAME", "worker-0")
        .env("POD_UID", &uid)
        .env("POD_NAMESPACE", &ns.name)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    let cmd_pid = common::cli::pid_from(&pidfile).await;
    let api: kube::Api<fenced_lease::api::FencedLeaseClaim> = ns.api();
    let claim = api
        .list(&Default::default())
        .await
        .expect("claims")
        .items
        .pop()
        .expect("the run's claim");
    assert_eq!(claim.spec.pod_name.as_deref(), Some("worker-0"));
    assert!(
        claim.spec.holder_identity.starts_with("worker-0-"),
        "{:?}",
        claim.spec
    );
    let owners = claim.metadata.owner_references.unwrap_or_default();
    assert_eq!(
        owners
            .iter()
            .map(|o| (o.kind.as_str(), o.name.as_str(), o.uid.as_str()))
            .collect::<Vec<_>>(),
        [("Pod", "worker-0", uid.as_str())]
    );

    pods.delete("worker-0", &Default::default())
        .await
        .expect("delete pod");
    let status = wait_exit(&mut run, Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(76), "the hold ends with the pod");
    assert!(!alive(cmd_pid), "CMD still runs");
}

/// `kubectl fence status db -w` and the lines it printed so far.
struct StatusWatch {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl StatusWatch {
    fn start(ns: &TestNamespace) -> Self {
        let mut child = fence(ns)
            .args(["status", "db", "-w"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("status -w");
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let reader = BufReader::new(child.stdout.take().expect("stdout"));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Self { child, lines }
    }

    /// The rows' HOLDER and TOKEN columns, once `n` rows are there.
    async fn rows(&self, what: &str, n: usize) -> Vec<(String, String)> {
        wait_for(what, WAIT, || {
            let lines = self.lines.lock().unwrap().clone();
            let rows: Vec<(String, String)> = lines
                .iter()
                .skip(1)
                .map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    match f.as_slice() {
                        [_, "<lease", "deleted>"] => ("<lease deleted>".into(), String::new()),
                        [_, "<none>", token, _] => ("<none>".into(), token.to_string()),
                        [_, holder, _, token, _] => (holder.to_string(), token.to_string()),
                        _ => panic!("unexpected line {l:?} in {lines:#?}"),
                    }
                })
                .collect();
            async move { (rows.len() >= n).then_some(rows) }
        })
        .await
    }
}

/// `kubectl fence acquire db` as `identity`, then `release` of that claim.
fn acquire_and_release(ns: &TestNamespace, identity: &str) {
    let out = fence(ns)
        .args([
            "acquire",
            "db",
            "--wait",
            "30s",
            "--identity",
            identity,
            "-o",
            "name",
        ])
        .output()
        .expect("acquire");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let claim = stdout(&out).trim().to_string();
    let out = fence(ns)
        .args(["release", "db", &claim])
        .output()
        .expect("release");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `status -w`: the lease as it is, then one line per change of hands (granted, released,
/// granted again, released, deleted), and nothing else.
#[tokio::test]
async fn status_watch_prints_a_line_each_time_the_lease_changes_hands() {
    let ns = TestNamespace::new("fence-watch").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 30);
    let mut watch = StatusWatch::start(&ns);
    watch.rows("the first row", 1).await;
    acquire_and_release(&ns, "a");
    watch.rows("a's grant and release", 3).await;
    acquire_and_release(&ns, "b");
    watch.rows("b's grant and release", 5).await;
    common::run(
        ns.kubectl()
            .args(["delete", "fencedlease", "db", "--timeout=30s"]),
    );
    let seen = watch.rows("the deletion", 6).await;
    let _ = watch.child.kill();
    let _ = watch.child.wait();
    let lines = watch.lines.lock().unwrap().clone();
    let holders: Vec<&str> = seen.iter().map(|(h, _)| h.as_str()).collect();
    assert_eq!(
        holders,
        ["<none>", "a", "<none>", "b", "<none>", "<lease deleted>"],
        "{lines:#?}"
    );
    let tokens: Vec<i64> = seen[..5].iter().map(|(_, t)| t.parse().unwrap()).collect();
    assert!(
        tokens[0] < tokens[1] && tokens[1] == tokens[2] && tokens[2] < tokens[3],
        "tokens: {tokens:?}"
    );
    assert_eq!(tokens[3], tokens[4], "a release keeps the last token");
    assert_eq!(lines[0].split_whitespace().next(), Some("TIME"));
}

/// `kubectl fence <TAB>` through kubectl's own plugin completion (kubectl runs
/// kubectl_complete-fence from PATH), and `kubectl fence completion bash` for the one-word
/// command: commands, `-o` formats, the lease names of the namespace asked for, and for
/// `release` the claims on the lease named.
#[tokio::test]
async fn completion_offers_commands_formats_and_the_namespaces_leases() {
    let ns = TestNamespace::new("fence-complete").await;
    ns.create_lease("db-migrate", 15);
    ns.create_lease("nightly", 15);
    ns.create_claim("waiter", "nightly", None).await;
    ns.create_claim("other", "db-migrate", None).await;
    let kubectl = &common::control_plane().kubectl;
    let bin = common::bin("kubectl-fence").parent().unwrap().to_path_buf();
    let scripts = common::repo_root().join("crates/kubectl-fence/src/completion");
    let path = std::env::join_paths(
        [bin, scripts, kubectl.parent().unwrap().to_path_buf()]
            .into_iter()
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    let complete = |words: &[&str]| {
        let out = Command::new(kubectl)
            .args(["__complete", "fence"])
            .args(words)
            .env("PATH", &path)
            .env("KUBECONFIG", ns.admin_kubeconfig())
            .output()
            .expect("kubectl __complete");
        stdout(&out)
    };
    assert_eq!(complete(&["st"]), "status\n:4\n");
    assert_eq!(complete(&["status", "-o", "j"]), "json\n:4\n");
    assert_eq!(
        complete(&["-n", &ns.name, "run", ""]),
        "db-migrate\nnightly\n:4\n"
    );
    assert_eq!(
        complete(&["release", "-n", &ns.name, "nightly", ""]),
        "waiter\n:4\n",
        "the claims on that lease"
    );

    let bash = format!(
        "source <(kubectl-fence completion bash); COMP_WORDS=(kubectl-fence --kubeconfig {} -n {} status d); COMP_CWORD=6; _kubectl_fence; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        ns.admin_kubeconfig().display(),
        ns.name
    );
    let out = Command::new("bash")
        .args(["-c", &bash])
        .env("PATH", &path)
        .output()
        .expect("bash");
    assert_eq!(
        stdout(&out),
        "db-migrate\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
