//! `kubectl fence run` across an apiserver and etcd restart (`hack/control-plane restart`):
//! a holder whose lease outlasts the outage keeps its command running, a waiter queued before
//! the outage and one started during it both wait it out, and each is granted in turn once
//! the one before exits; all exit 0. A test binary of its own: it restarts the shared control
//! plane, so nothing else may run beside it (cargo runs test binaries one after another).

use crate::common;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use common::cli::{alive, fence, pid_from, read, scratch, spawn_logged, wait_exit};
use common::operator::OperatorProcess;
use common::{TestNamespace, control_plane, wait_for};
use fenced_lease::api::FencedLease;

const WAIT: Duration = Duration::from_secs(120);

fn api_ready() -> bool {
    control_plane()
        .kubectl_cmd()
        .args(["--request-timeout=1s", "get", "--raw", "/readyz"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `kubectl fence run l --identity WHO -- sh -c SCRIPT`, its stderr in `WHO.stderr`.
fn run(ns: &TestNamespace, who: &str, script: String) -> Child {
    let mut cmd = fence(ns);
    cmd.args(["run", "l", "--identity", who, "--", "sh", "-c", &script]);
    spawn_logged(cmd, &scratch(ns, &format!("{who}.stderr")))
}

/// Waits until a claim of `who` is queued on the lease.
async fn wait_queued(ns: &TestNamespace, what: &str, who: &str) {
    let claims: kube::Api<fenced_lease::api::FencedLeaseClaim> = ns.api();
    wait_for(what, WAIT, || async {
        let list = claims.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|c| c.spec.holder_identity == who)
            .then_some(())
    })
    .await;
}

/// Restarts etcd and the apiserver in place (same ports and data), and starts a waiter, late,
/// while the API is down (a CronJob firing then): late's run.
async fn restart_with_a_late_waiter(ns: &TestNamespace, log: &Path) -> Child {
    let restarted_at = Instant::now();
    let restart = std::thread::spawn(move || {
        control_plane()
            .restart_command()
            .output()
            .expect("hack/control-plane restart")
    });
    let down = wait_for("the apiserver to go down", WAIT, || async {
        (!api_ready()).then(Instant::now)
    })
    .await;
    let late = run(
        ns,
        "late",
        format!("echo \"late $FENCE_TOKEN\" >> {}", log.display()),
    );
    let out = tokio::task::spawn_blocking(move || restart.join().expect("restart thread"))
        .await
        .expect("join");
    assert!(
        out.status.success(),
        "restart: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let up = wait_for("the apiserver to be ready", WAIT, || async {
        api_ready().then(Instant::now)
    })
    .await;
    eprintln!(
        "MEASURED apiserver unavailable for {:?} (hack/control-plane restart took {:?})",
        up - down,
        up - restarted_at
    );
    late
}

/// After the outage, the holder kept its command (`holder_cmd`) running and still holds the
/// lease; the waiters still wait, late among them.
async fn assert_all_rode_it_out(
    ns: &TestNamespace,
    holder_cmd: u32,
    holder: &mut Child,
    waiter: &mut Child,
    late: &mut Child,
) {
    assert!(alive(holder_cmd), "the holder's command was stopped");
    assert!(
        holder.try_wait().expect("try_wait").is_none(),
        "holder exited: {}",
        read(&scratch(ns, "holder.stderr"))
    );
    let lease = wait_for("the lease to be readable", WAIT, || async {
        ns.api::<FencedLease>().get("l").await.ok()
    })
    .await;
    let holder_identity = lease.status.and_then(|s| s.holder).map(|h| h.identity);
    assert_eq!(holder_identity.as_deref(), Some("holder"));
    for (who, child) in [("waiter", waiter), ("late", late)] {
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "{who} exited during the outage: {}",
            read(&scratch(ns, &format!("{who}.stderr")))
        );
    }
    wait_queued(ns, "the late waiter to queue", "late").await;
}

/// The log the runs wrote: the holder's token, its end, then the waiter's and late's tokens,
/// growing.
fn assert_granted_in_turn(log: &Path) {
    let lines: Vec<String> = read(log).lines().map(str::to_owned).collect();
    let token = |line: &str, who: &str| -> i64 {
        line.strip_prefix(&format!("{who} "))
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{who} line: {lines:?}"))
    };
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(lines[1], "holder-end", "{lines:?}");
    let (t_holder, t_waiter, t_late) = (
        token(&lines[0], "holder"),
        token(&lines[2], "waiter"),
        token(&lines[3], "late"),
    );
    assert!(t_holder < t_waiter && t_waiter < t_late, "{lines:?}");
}

#[tokio::test]
async fn holders_and_waiters_ride_out_an_apiserver_and_etcd_restart() {
    let ns = TestNamespace::new("cp-restart-holder").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    // Longer than the outage: a holder survives an outage of up to about
    // duration - margin - renew period - retry pause = 60 - 2 - 20 - 4 = 34 s.
    ns.create_lease("l", 60);
    let log = scratch(&ns, "log");
    let stop = scratch(&ns, "stop");
    let pidfile = scratch(&ns, "holder.pid");
    let mut holder = run(
        &ns,
        "holder",
        format!(
            "echo $$ > {pid}; echo \"holder $FENCE_TOKEN\" >> {log}; while [ ! -e {stop} ]; do sleep 0.2; done; echo holder-end >> {log}",
            pid = pidfile.display(),
            log = log.display(),
            stop = stop.display()
        ),
    );
    let holder_cmd = pid_from(&pidfile).await;
    let mut waiter = run(
        &ns,
        "waiter",
        format!("echo \"waiter $FENCE_TOKEN\" >> {}", log.display()),
    );
    wait_queued(&ns, "the waiter to queue", "waiter").await;

    let mut late = restart_with_a_late_waiter(&ns, &log).await;
    assert_all_rode_it_out(&ns, holder_cmd, &mut holder, &mut waiter, &mut late).await;

    // The holder finishes; the waiters are granted in turn.
    std::fs::write(&stop, "").expect("stop file");
    for (who, child) in [
        ("holder", &mut holder),
        ("waiter", &mut waiter),
        ("late", &mut late),
    ] {
        let status = wait_exit(child, WAIT).await;
        assert!(
            status.success(),
            "{who}: {status}: {}",
            read(&scratch(&ns, &format!("{who}.stderr")))
        );
    }
    assert_granted_in_turn(&log);
}
