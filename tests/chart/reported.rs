//! The refusals holders report, in a real Prometheus: a holder of the Rust library whose
//! runtime is paused (blocked: no heartbeat, as in a GC pause) past its term resumes and writes
//! with the token it had, to PostgreSQL (a table bound to a scope) under one lease and to Redis
//! (a scope's key) under another. Each guard refuses; the library reports each refusal (a
//! `WriteRefused` Event on the FencedLease from the pod); the operator counts them per lease,
//! and the critical alert must fire in Prometheus's alerts API within [`BOUND`], once per
//! lease, naming it. The Event must name the refused pod and both tokens. The alerts of the
//! other test (the apiserver's counters) are told apart by their labels.

use std::future::Future;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fenced_lease::fence::Error as FenceError;
use fenced_lease::holder::{AcquireOptions, Refusal, acquire};
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use serde_json::Value;

use crate::alerts::{chart_rule_groups, dashboard_query};
use crate::common::fence::datastores;
use crate::common::operator::OperatorProcess;
use crate::common::prometheus::Prometheus;
use crate::common::{Beating, TestNamespace, client_from_kubeconfig, wait_for};

const WAIT: Duration = Duration::from_secs(30);

/// From the refused write to the alert firing: the Event (sent at once), the operator's watch,
/// a scrape and an evaluation (2 s each here), with room for a 2-core machine under load.
const BOUND: Duration = Duration::from_secs(20);

const ALERT: &str = "FencedLeaseWriteRefused";

/// What a paused holder saw: its token, and what the library made of its stale write.
struct Stale {
    token: i64,
    refusal: Result<Option<Refusal>, String>,
    resumed_at: Instant,
}

/// Holder `pod` of `lease` on a runtime of its own: acquires, writes with `write`, says its
/// token on `granted`, then pauses (its runtime blocked until `resume`: no heartbeat, no timer),
/// writes again with the token it had, and asks the library what the error means (which
/// reports it), then waits until the report is sent.
fn paused_holder<W, F>(
    kubeconfig: std::path::PathBuf,
    namespace: String,
    lease: &'static str,
    write: W,
    granted: mpsc::Sender<i64>,
    resume: mpsc::Receiver<()>,
) -> std::thread::JoinHandle<Stale>
where
    W: Fn(i64) -> F + Send + 'static,
    F: Future<Output = Result<(), FenceError>>,
{
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let client = client_from_kubeconfig(&kubeconfig).await;
            let options = AcquireOptions::default().wait(WAIT);
            let guard = acquire(client, &namespace, lease, options)
                .await
                .expect("acquire");
            let token = guard.token().expect("held");
            write(token).await.expect("the holder's write");
            granted.send(token).unwrap();
            // The pause: nothing of this runtime runs until resumed.
            resume.recv().unwrap();
            let resumed_at = Instant::now();
            let refusal = match write(token).await {
                Ok(()) => Err("the stale write was accepted".to_string()),
                Err(e) => Ok(guard.refusal(&e)),
            };
            guard.reported().await;
            drop(guard);
            Stale {
                token,
                refusal,
                resumed_at,
            }
        })
    })
}

/// The alert `ALERT` for lease `namespace/lease`, if Prometheus has it firing now.
async fn firing(prometheus: &Prometheus, namespace: &str, lease: &str) -> Option<Value> {
    prometheus.alerts().await.into_iter().find(|a| {
        a["labels"]["alertname"] == ALERT
            && a["labels"]["namespace"] == namespace
            && a["labels"]["lease"] == lease
            && a["state"] == "firing"
    })
}

/// The WriteRefused Events on FencedLease `lease`.
async fn reports(ns: &TestNamespace, lease: &str) -> Vec<Event> {
    let selector = format!("reason=WriteRefused,regarding.name={lease}");
    let params = ListParams::default().fields(&selector);
    ns.api::<Event>().list(&params).await.unwrap().items
}

/// `kubectl fence ARGS` as the cluster's admin: its output.
fn kubectl_fence(args: &[&str]) -> String {
    let out = std::process::Command::new(common::bin("kubectl-fence"))
        .arg("--kubeconfig")
        .arg(&crate::common::control_plane().kubeconfig)
        .args(args)
        .output()
        .expect("kubectl fence");
    assert!(out.status.success(), "kubectl fence {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The two stale holders' guards: a PostgreSQL table bound to a scope, a Redis scope's key.
struct Guards {
    table: String,
    redis: fenced_lease::fence::redis::Scope,
}

async fn guards() -> Guards {
    use fenced_lease::fence::postgres::{Scope, install};
    let (pg, connection) = tokio_postgres::connect(&datastores().postgres, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    install(&pg).await.unwrap();
    let table = format!("payouts_{:08x}", rand::random::<u32>());
    pg.batch_execute(&format!(
        "CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, account BIGINT NOT NULL, amount BIGINT NOT NULL)"
    ))
    .await
    .unwrap();
    Scope::new(&format!("account-{table}"))
        .unwrap()
        .enable(&pg, &table)
        .await
        .unwrap();
    let redis = fenced_lease::fence::redis::Scope::new(&table).unwrap();
    let mut conn = redis_connection().await;
    fenced_lease::fence::redis::load(&mut conn).await.unwrap();
    Guards { table, redis }
}

async fn redis_connection() -> redis::aio::MultiplexedConnection {
    redis::Client::open(datastores().redis.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A payout to account 42 in `table`, presenting `token` (a new connection each time: the
/// holder's runtime owns it).
async fn pay(table: String, token: i64) -> Result<(), FenceError> {
    let (mut pg, connection) =
        tokio_postgres::connect(&datastores().postgres, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let tx = fenced_lease::fence::postgres::begin(&mut pg, token).await?;
    tx.batch_execute(&format!(
        "INSERT INTO {table} (account, amount) VALUES (42, 100)"
    ))
    .await?;
    tx.commit().await
}

/// A balance of account 42 in the Redis scope, presenting `token`.
async fn set_balance(
    scope: fenced_lease::fence::redis::Scope,
    token: i64,
) -> Result<(), FenceError> {
    let mut conn = redis_connection().await;
    let key = scope.key("balance");
    scope.set(&mut conn, &key, "100", token).await
}

/// pa holding `lease` in a runtime of its own, writing with `write` (see [`paused_holder`]):
/// its thread, what resumes it and what says its token once it has written.
struct PausedHolder {
    lease: &'static str,
    thread: std::thread::JoinHandle<Stale>,
    resume: mpsc::Sender<()>,
    granted: mpsc::Receiver<i64>,
}

fn pa_holds<W, F>(
    kubeconfig: &Path,
    ns: &TestNamespace,
    lease: &'static str,
    write: W,
) -> PausedHolder
where
    W: Fn(i64) -> F + Send + 'static,
    F: Future<Output = Result<(), FenceError>>,
{
    let (granted, token) = mpsc::channel();
    let (resume, resumed) = mpsc::channel();
    let thread = paused_holder(
        kubeconfig.to_path_buf(),
        ns.name.clone(),
        lease,
        write,
        granted,
        resumed,
    );
    PausedHolder {
        lease,
        thread,
        resume,
        granted: token,
    }
}

/// pb is granted each lease after pa's term, and writes; it keeps heartbeating while the
/// returned beats live. Returns its tokens of payouts and balances.
async fn pb_holds_both_and_writes(ns: &TestNamespace, g: &Guards) -> (i64, i64, [Beating; 2]) {
    ns.create_claim("pb-payouts", "payouts", Some("pb")).await;
    ns.create_claim("pb-balances", "balances", Some("pb")).await;
    let beats = [
        ns.keep_beating("pb-payouts", Duration::from_secs(1)),
        ns.keep_beating("pb-balances", Duration::from_secs(1)),
    ];
    let pg_second = wait_for("pb granted payouts", WAIT, || {
        ns.granted_token("pb-payouts")
    })
    .await;
    let redis_second = wait_for("pb granted balances", WAIT, || {
        ns.granted_token("pb-balances")
    })
    .await;
    pay(g.table.clone(), pg_second).await.expect("pb pays");
    set_balance(g.redis.clone(), redis_second)
        .await
        .expect("pb sets the balance");
    (pg_second, redis_second, beats)
}

/// No alert before a refusal (pa's first writes were accepted; pb writes), over several
/// evaluations.
async fn assert_no_alert_yet(prometheus: &Prometheus, ns: &TestNamespace) {
    let scrapes = "count_over_time(up{job=\"fenced-lease-operator\"}[1h]) >= 5";
    wait_for(
        "Prometheus to scrape the operator 5 times",
        WAIT,
        || async { (!prometheus.query(scrapes).await?.as_array()?.is_empty()).then_some(()) },
    )
    .await;
    let quiet = format!(
        "ALERTS{{alertname=\"{ALERT}\",namespace=\"{}\"}}[1h]",
        ns.name
    );
    let quiet = prometheus.query(&quiet).await.expect("query ALERTS");
    assert_eq!(
        quiet,
        serde_json::json!([]),
        "{ALERT} with no write refused"
    );
}

/// A stale write of pa refused by a guard: under which lease, when pa resumed, the token it
/// presented and the highest one the guard had seen.
struct Refused {
    lease: &'static str,
    resumed_at: Instant,
    presented: i64,
    highest: i64,
}

/// pa, resumed, wrote with its old token (`first`) after `second` was granted: the guard
/// refused, and the library told it was a newer holder's (and reported it).
async fn refused_once_resumed(pa: PausedHolder, first: i64, second: i64) -> Refused {
    let thread = pa.thread;
    let stale = tokio::task::spawn_blocking(move || thread.join().unwrap())
        .await
        .unwrap();
    assert_eq!(stale.token, first);
    assert_eq!(
        stale.refusal,
        Ok(Some(Refusal::NewerHolder)),
        "pa's stale write under {}",
        pa.lease
    );
    Refused {
        lease: pa.lease,
        resumed_at: stale.resumed_at,
        presented: first,
        highest: second,
    }
}

/// The refusal `r` fires the critical alert within [`BOUND`], as one WriteRefused Event from
/// pa with both tokens, which `kubectl fence status` shows.
async fn assert_alerted_and_reported(prometheus: &Prometheus, ns: &TestNamespace, r: &Refused) {
    let Refused {
        lease,
        resumed_at,
        presented,
        highest,
    } = *r;
    let alert = wait_for(&format!("{ALERT} firing for {lease}"), BOUND, || {
        firing(prometheus, &ns.name, lease)
    })
    .await;
    eprintln!(
        "{ALERT} firing {:.1} s after pa resumed: {alert}",
        resumed_at.elapsed().as_secs_f64()
    );
    assert_eq!(alert["labels"]["severity"], "critical", "{alert}");
    let events = reports(ns, lease).await;
    let [event] = &events[..] else {
        panic!("one WriteRefused Event on {lease}: {events:?}");
    };
    assert_eq!(event.reporting_instance.as_deref(), Some("pa"), "{event:?}");
    let note = event.note.clone().unwrap_or_default();
    let tokens = format!("token {presented} is lower than {highest}");
    assert!(
        note.contains(&tokens),
        "{lease}'s Event does not give both tokens: {note}"
    );
    // What the on-call types first: the lease's status names the last refusal.
    let status = kubectl_fence(&["status", lease, "-n", &ns.name]);
    let line = status
        .lines()
        .find(|l| l.starts_with("Refused:"))
        .unwrap_or_else(|| panic!("no Refused line in status:\n{status}"));
    assert!(
        line.contains("once; last") && line.contains("pa was refused") && line.contains(&tokens),
        "{line}"
    );
}

/// The operator counts the refusals in one series per lease, and the dashboard's panel, as
/// Grafana would ask with this namespace and every lease chosen, shows both.
async fn assert_counted_and_shown(prometheus: &Prometheus, ns: &TestNamespace) {
    let counted = prometheus
        .query(&format!(
            "fenced_lease_write_refusals_reported_total{{namespace=\"{}\"}}",
            ns.name
        ))
        .await
        .expect("the operator's counter");
    assert_eq!(
        counted.as_array().map(Vec::len),
        Some(2),
        "one series per lease: {counted}"
    );
    let panel = dashboard_query("Writes refused, as the holders reported them")
        .replace("$namespace", &ns.name)
        .replace("$lease", ".*");
    for lease in ["payouts", "balances"] {
        assert!(
            prometheus.shows(&panel, "lease", lease).await,
            "the dashboard's panel does not show {lease}'s refusal: {:?}",
            prometheus.query(&panel).await
        );
    }
}

#[tokio::test]
async fn a_paused_holders_refusals_by_postgresql_and_redis_fire_the_critical_alert() {
    let _serial = crate::OPERATORS.lock().await;
    let ns = TestNamespace::new("reported").await;
    ns.with_fence_policies().await; // refusal-reports.yaml among them
    let op = OperatorProcess::start(&ns.name, &[]);
    let groups = chart_rule_groups(&ns.name);
    let prometheus = Prometheus::start(&ns.name, &groups, Some(op.http_port().await)).await;
    let pods = ns.app_pods(&["pa", "pb"]).await;
    for lease in ["payouts", "balances"] {
        ns.kubectl_apply(&format!("apiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata: {{name: {lease}}}\nspec: {{leaseDurationSeconds: 3}}\n"));
    }
    let g = guards().await;

    // pa holds both leases, each in a runtime of its own, and writes.
    let kubeconfig = ns.kubeconfig_as_pod(&pods[0]).await;
    let table = g.table.clone();
    let pg = pa_holds(&kubeconfig, &ns, "payouts", move |token| {
        pay(table.clone(), token)
    });
    let scope = g.redis.clone();
    let redis = pa_holds(&kubeconfig, &ns, "balances", move |token| {
        set_balance(scope.clone(), token)
    });
    let first = |pa: &PausedHolder| pa.granted.recv_timeout(WAIT).expect("pa's first write");
    let (pg_first, redis_first) = (first(&pg), first(&redis));

    // Both pa's runtimes are paused now: pb is granted each lease after pa's term, and writes.
    let (pg_second, redis_second, _beats) = pb_holds_both_and_writes(&ns, &g).await;
    assert_no_alert_yet(&prometheus, &ns).await;

    // pa resumes, writes with its old tokens: both guards refuse, the library reports.
    pg.resume.send(()).unwrap();
    redis.resume.send(()).unwrap();
    let refused = [
        refused_once_resumed(pg, pg_first, pg_second).await,
        refused_once_resumed(redis, redis_first, redis_second).await,
    ];
    for r in &refused {
        assert_alerted_and_reported(&prometheus, &ns, r).await;
    }
    assert_counted_and_shown(&prometheus, &ns).await;
    drop(prometheus);
}

/// A holder may report only under its own name: pb cannot send a report as pa, nor change
/// pa's report (deploy/admission/refusal-reports.yaml).
#[tokio::test]
async fn a_pod_reports_refusals_only_under_its_own_name() {
    let ns = TestNamespace::new("report-name").await;
    ns.with_fence_policies().await;
    let pods = ns.app_pods(&["pa", "pb"]).await;
    let as_pa = kube::Api::<Event>::namespaced(ns.client_as_pod(&pods[0]).await, &ns.name);
    let as_pb = kube::Api::<Event>::namespaced(ns.client_as_pod(&pods[1]).await, &ns.name);
    let lease = fenced_lease::holder::refusals::lease_reference(&ns.name, "books");
    let event = |instance: &str| {
        fenced_lease::holder::refusals::refusal_event(&lease, instance, 1, "fenced out")
    };
    let post = kube::api::PostParams::default();
    let (code, message) = crate::common::api_error_message(as_pb.create(&post, &event("pa")).await);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("reportingInstance must be \"pb\""),
        "{message}"
    );
    let mine = as_pa.create(&post, &event("pa")).await.expect("pa reports");
    let name = mine.metadata.name.clone().unwrap();
    // pb adds to pa's count (an alert under pa's name): refused. (Changing a report's
    // reportingInstance the Events API itself refuses, 422.)
    let add = serde_json::json!({"series": {"count": 9, "lastObservedTime": mine.event_time}});
    let patched = as_pb
        .patch(&name, &Default::default(), &kube::api::Patch::Merge(&add))
        .await;
    let (code, message) = crate::common::api_error_message(patched);
    assert_eq!(code, 403, "{message}");
    as_pa
        .patch(&name, &Default::default(), &kube::api::Patch::Merge(&add))
        .await
        .expect("pa adds to its own report");
}

/// A script under `kubectl fence run` says "my write was refused" by an exit code: run reports
/// it as the libraries do (one WriteRefused Event from the pod, counted by the operator) and
/// exits with that code; any other code reports nothing.
#[tokio::test]
async fn kubectl_fence_run_reports_the_refusal_its_command_signals() {
    let _serial = crate::OPERATORS.lock().await;
    let ns = TestNamespace::new("run-refused").await;
    ns.with_fence_policies().await;
    let op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa"]).await;
    let kubeconfig = ns.kubeconfig_as_pod(&pods[0]).await;
    ns.create_lease("ledger", 15);
    let run = |script: &str| {
        std::process::Command::new(common::bin("kubectl-fence"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["-n", &ns.name, "run", "ledger", "--wait", "30s"])
            .args(["--refused-exit-code", "65", "--", "sh", "-c", script])
            .output()
            .expect("kubectl fence run")
    };
    let refused = run("echo \"$FENCE_TOKEN\"; exit 65");
    assert_eq!(refused.status.code(), Some(65), "{refused:?}");
    let token = String::from_utf8_lossy(&refused.stdout).trim().to_string();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("was refused for a stale token"), "{stderr}");
    let events = reports(&ns, "ledger").await;
    let [event] = &events[..] else {
        panic!("one WriteRefused Event on ledger: {events:?}");
    };
    assert_eq!(event.reporting_instance.as_deref(), Some("pa"), "{event:?}");
    let note = event.note.clone().unwrap_or_default();
    assert!(
        note.contains("exited 65") && note.contains(&format!("token {token}")),
        "{note}"
    );
    let other = run("exit 3");
    assert_eq!(other.status.code(), Some(3), "{other:?}");
    assert_eq!(
        reports(&ns, "ledger").await.len(),
        1,
        "exit 3 is no refusal"
    );
    let port = op.http_port().await;
    let metrics = wait_for("the operator to count it", WAIT, || async {
        let (_, body) = crate::common::http_get(port, "/metrics").await?;
        body.lines()
            .any(|l| {
                l.starts_with("fenced_lease_write_refusals_reported_total")
                    && l.contains("lease=\"ledger\"")
                    && l.ends_with(" 1")
            })
            .then_some(body)
    })
    .await;
    drop(metrics);
}
