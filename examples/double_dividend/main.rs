//! `make demo`: the "double dividend". Two workers contend for one FencedLease to pay account
//! 42's dividend exactly once. Worker A takes the lease and starts paying; it is paused
//! (SIGSTOP, a stop-the-world pause) past its lease; B is granted the next token, finds the
//! dividend unpaid and pays it; A resumes, still believing it holds the lease, and writes with
//! its old token. Its writes are refused by the apiserver (ConfigMaps fenced by the admission
//! policies: its token is too old, and its pod no longer holds the lease — a plain delete is
//! refused too) and by PostgreSQL (a fenced row). Each worker runs as its own pod's identity (a
//! ServiceAccount token bound to the pod, as every pod mounts). Prints the timeline; exits 0
//! only if every stale write was refused and the dividend was paid once.
//!
//! Run by `hack/demo` (which starts the control plane, PostgreSQL and the operator); by hand:
//!
//! ```console
//! $ cargo run --all-features --example double-dividend -- --namespace demo
//! ```
//! with KUBECONFIG, FL_POSTGRES_URL, the CRDs, deploy/admission and an operator watching
//! `demo` in place. A worker is this program run with `--worker NAME`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use fenced_lease::api::FencedLease;
use fenced_lease::fence::kube::stamp;
use fenced_lease::fence::postgres::Scope;
use fenced_lease::holder::{AcquireOptions, acquire};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::AuthInfo;
use kube::{Client, Config, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::mpsc;

mod workers;
use workers::{Launch, Worker};

type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

const LEASE: &str = "dividend-42";
const LEASE_SECONDS: u64 = 3;
/// How long paying takes: the pause hits in the middle of it.
const PAYING: Duration = Duration::from_millis(2000);
/// The ServiceAccount the workers' pods run as.
const WORKER_ACCOUNT: &str = "dividend-worker";
/// The payout ConfigMap.
const PAYOUT: &str = "dividend-42-2024q4";

/// The double dividend: a stalled lease holder whose writes are fenced out.
#[derive(Parser)]
struct Args {
    /// Namespace of the lease and the ConfigMaps (an operator must watch it).
    #[arg(short = 'n', long)]
    namespace: String,
    /// Where the workers' logs go.
    #[arg(long, default_value = "/tmp")]
    log_dir: PathBuf,
    /// Run the workers as pods of IMAGE on a node (hack/node), paused by freezing their cgroup:
    /// run as root on the node's machine. Without it, workers are processes holding tokens of
    /// pods no kubelet runs, paused by SIGSTOP.
    #[arg(long, value_name = "IMAGE")]
    pods: Option<String>,
    /// PostgreSQL as the workers' pods reach it (default: FL_POSTGRES_URL).
    #[arg(long, value_name = "URL", requires = "pods")]
    pods_postgres_url: Option<String>,
    /// Run as worker NAME (used by the demo itself).
    #[arg(long, hide = true)]
    worker: Option<String>,
    /// The PostgreSQL table of the ledger (workers only).
    #[arg(long, hide = true)]
    table: Option<String>,
    /// Start of the timeline, ms since the epoch (workers only).
    #[arg(long, hide = true)]
    t0_ms: Option<u128>,
}

/// One line a worker reports to the demo, as JSON on its stdout.
#[derive(Serialize, Deserialize, Debug)]
struct Report {
    at_ms: u128,
    event: Event,
    text: String,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Event {
    Granted,
    Paying,
    Accepted,
    Refused,
    Failed,
    Done,
}

fn epoch_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let result = match args.worker.clone() {
        Some(name) => worker(&args, &name).await,
        None => demo(&args).await,
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("double-dividend: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn postgres() -> Result<tokio_postgres::Client> {
    let url = std::env::var("FL_POSTGRES_URL").map_err(|_| "FL_POSTGRES_URL is not set")?;
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

// ---- the worker ---------------------------------------------------------------------------

/// Takes the lease, reads the ledger, pays (slowly), and writes the payout with its token to a
/// ConfigMap, a receipt ConfigMap and the PostgreSQL row. Reports each step.
async fn worker(args: &Args, name: &str) -> Result<bool> {
    let (table, t0) = (
        args.table.clone().ok_or("--table is required")?,
        args.t0_ms.ok_or("--t0-ms is required")?,
    );
    let report = |event: Event, text: String| {
        let line = Report {
            at_ms: epoch_ms().saturating_sub(t0),
            event,
            text,
        };
        println!("{}", serde_json::to_string(&line).unwrap_or_default());
    };
    // As the worker's pod: its ServiceAccount token, bound to the pod (in a pod, the one its
    // kubelet mounts; else the demo's).
    let mut config = Config::infer().await?;
    if let Ok(token) = std::env::var("FL_DEMO_TOKEN") {
        config.auth_info = AuthInfo {
            token: Some(token.into()),
            ..AuthInfo::default()
        };
    }
    let client = Client::try_from(config)?;
    let mut db = postgres().await?;
    let options = AcquireOptions::default()
        .identity(name)
        .wait(Duration::from_secs(60));
    let guard = acquire(client.clone(), &args.namespace, LEASE, options).await?;
    // The check: from here on the worker acts on this token, however long the act takes.
    let token = guard.token()?;
    report(
        Event::Granted,
        format!("granted lease {LEASE} with token {token}"),
    );
    let row = db
        .query_opt(
            &format!("SELECT paid_by FROM {table} WHERE account = 42 LIMIT 1"),
            &[],
        )
        .await?;
    let paid_by: Option<String> = row.map(|r| r.get(0));
    if let Some(by) = paid_by {
        report(Event::Done, format!("ledger: already paid by {by}"));
        return Ok(true);
    }
    report(
        Event::Paying,
        format!(
            "ledger: account 42's dividend is unpaid; paying it (takes {}s)",
            PAYING.as_secs_f32()
        ),
    );
    tokio::time::sleep(PAYING).await;

    let configmaps: Api<ConfigMap> = Api::namespaced(client, &args.namespace);
    // A payout found there is a draft of an earlier attempt: it goes first (a plain delete).
    match configmaps.delete(PAYOUT, &DeleteParams::default()).await {
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        deleted => report_kube(
            &report,
            &format!("delete ConfigMap {PAYOUT}"),
            token,
            deleted.map(drop),
        ),
    }
    let mut payout = config_map(PAYOUT, name);
    stamp(&mut payout, LEASE, token);
    let written = configmaps
        .patch(
            PAYOUT,
            &PatchParams::apply(name).force(),
            &Patch::Apply(&payout),
        )
        .await;
    report_kube(
        &report,
        &format!("ConfigMap {PAYOUT}"),
        token,
        written.map(drop),
    );
    let receipt_name = format!("receipt-{name}");
    let mut receipt = config_map(&receipt_name, name);
    stamp(&mut receipt, LEASE, token);
    let written = configmaps.create(&PostParams::default(), &receipt).await;
    report_kube(
        &report,
        &format!("ConfigMap {receipt_name} (new)"),
        token,
        written.map(drop),
    );
    // The payout ledger is append-only: a payout is a new row, in a transaction presenting the
    // token to the ledger's scope (the lease).
    let written = async {
        let tx = Scope::of_lease(&args.namespace, LEASE)
            .begin(&mut db, token)
            .await?;
        tx.execute(
            &format!(
                "INSERT INTO {table} (account, amount, paid_by, fence_token) VALUES (42, 100, $1, $2)"
            ),
            &[&name, &token],
        )
        .await?;
        tx.commit().await
    }
    .await;
    match written {
        Ok(()) => report(
            Event::Accepted,
            format!("ACCEPTED  PostgreSQL {table}: payout to account 42 <- token {token}"),
        ),
        Err(e) if e.is_fenced() => report(
            Event::Refused,
            format!("REFUSED   by PostgreSQL ({table}, payout to account 42): {e}"),
        ),
        Err(e) => report(Event::Failed, format!("FAILED    PostgreSQL: {e}")),
    }
    report(Event::Done, "done".into());
    let _ = guard.release().await; // a lost lease has nothing left to release
    Ok(true)
}

fn config_map(name: &str, paid_by: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            ("account".into(), "42".into()),
            ("dividend".into(), "2024-Q4".into()),
            ("paidBy".into(), paid_by.into()),
        ])),
        ..Default::default()
    }
}

fn report_kube(
    report: &impl Fn(Event, String),
    what: &str,
    token: i64,
    written: Result<(), kube::Error>,
) {
    match written {
        Ok(()) => report(
            Event::Accepted,
            format!("ACCEPTED  {what} <- token {token}"),
        ),
        Err(kube::Error::Api(status)) if status.code == 403 => {
            // "... ValidatingAdmissionPolicy 'P' with binding 'B' denied request: MESSAGE"
            let policy = status
                .message
                .split('\'')
                .nth(1)
                .unwrap_or("admission policy");
            let message = status
                .message
                .split_once("denied request: ")
                .map_or(status.message.as_str(), |(_, m)| m);
            report(
                Event::Refused,
                format!("REFUSED   {what}, by the apiserver ({policy}): {message}"),
            )
        }
        Err(e) => report(Event::Failed, format!("FAILED    {what}: {e}")),
    }
}

// ---- the demo -----------------------------------------------------------------------------

fn say(t0: Instant, who: &str, text: &str) {
    println!(
        "  {:>6.2}s  {who:<9} {text}",
        t0.elapsed().as_secs_f64(),
        who = who
    );
}

async fn demo(args: &Args) -> Result<bool> {
    let client = Client::try_default().await?;
    let db = postgres().await?;
    let table = format!("payouts_{:08x}", rand::random::<u32>());
    db.batch_execute(&format!(
        "CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, account BIGINT NOT NULL, amount BIGINT NOT NULL, paid_by TEXT NOT NULL)"
    ))
    .await?;
    // Every write of the ledger presents a token of the lease, checked against its scope.
    Scope::of_lease(&args.namespace, LEASE)
        .enable(&db, &table)
        .await?;
    let outcome = play(args, &client, &db, &table).await;
    // Clean up whatever happened: the lease (its finalizer and binding go with it), the table.
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), &args.namespace);
    let _ = leases.delete(LEASE, &DeleteParams::default()).await;
    let _ = wait_until(Duration::from_secs(20), || async {
        matches!(leases.get_opt(LEASE).await, Ok(None))
    })
    .await;
    let _ = db.batch_execute(&format!("DROP TABLE {table}")).await;
    outcome
}

async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        if Instant::now() > deadline {
            return Err(format!("timed out after {timeout:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Creates the lease and waits until the apiserver fences its objects.
async fn set_up(args: &Args, client: &Client) -> Result<()> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), &args.namespace);
    let lease: FencedLease = serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": LEASE},
        "spec": {
            "leaseDurationSeconds": LEASE_SECONDS,
            "fenceObjects": true,
            "fence": {"resources": [{"resource": "configmaps"}]},
        },
    }))?;
    leases.create(&PostParams::default(), &lease).await?;
    // The workers' ServiceAccount: hold leases, write ConfigMaps.
    let ns = args.namespace.as_str();
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": WORKER_ACCOUNT}}))?;
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": WORKER_ACCOUNT},
        "rules": [
            {"apiGroups": ["fencing.dev"], "resources": ["fencedleases"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["fencing.dev"], "resources": ["fencedleaseclaims"], "verbs": ["list", "watch", "create", "patch", "delete"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]},
        ],
    }))?;
    let role_binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": WORKER_ACCOUNT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": WORKER_ACCOUNT},
        "subjects": [{"kind": "ServiceAccount", "name": WORKER_ACCOUNT, "namespace": ns}],
    }))?;
    let create = PostParams::default();
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&create, &account)
        .await?;
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&create, &role)
        .await?;
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&create, &role_binding)
        .await?;
    // Policies and bindings reach admission through informers: probe with dry runs until a
    // malformed token is refused and a well-formed one finds the lease as params.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let probe = |token: &str| {
        let mut cm = config_map("probe", "nobody");
        cm.labels_mut()
            .insert("fencing.dev/lease".into(), LEASE.into());
        cm.annotations_mut()
            .insert("fencing.dev/token".into(), token.into());
        cm
    };
    wait_until(Duration::from_secs(30), || async {
        configmaps.create(&dry_run, &probe("x")).await.is_err()
            && configmaps.create(&dry_run, &probe("0")).await.is_ok()
    })
    .await
    .map_err(|e| {
        format!("the fence policies are not in force (kubectl apply -f deploy/admission): {e}")
    })?;
    Ok(())
}

async fn play(
    args: &Args,
    client: &Client,
    db: &tokio_postgres::Client,
    table: &str,
) -> Result<bool> {
    set_up(args, client).await?;
    println!(
        "Two workers pay account 42's dividend under FencedLease {}/{LEASE} ({LEASE_SECONDS}s lease,\nfenceObjects, and every ConfigMap fenced by kind). Each runs in a pod of its own, replaces the\npayout ConfigMap dividend-42-2024q4 (a plain delete, then a write), writes a receipt ConfigMap\nand appends the payout to PostgreSQL ledger {table}, each with its fencing token.\n",
        args.namespace
    );
    let (t0, t0_ms) = (Instant::now(), epoch_ms());
    let (tx, mut events) = mpsc::unbounded_channel();
    let postgres_url = std::env::var("FL_POSTGRES_URL").unwrap_or_default();
    let launch = Launch {
        namespace: &args.namespace,
        table,
        t0_ms,
        log_dir: &args.log_dir,
        image: args.pods.as_deref(),
        postgres_url: args.pods_postgres_url.as_deref().unwrap_or(&postgres_url),
        events: tx,
    };
    let mut a = Worker::start(client, &launch, "worker-a").await?;
    let mut b: Option<Worker> = None;
    let (mut stale_refused, mut stale_accepted, mut fresh_accepted) = (0, 0, 0);
    let mut paused = false;
    let deadline = tokio::time::sleep(Duration::from_secs(60));
    tokio::pin!(deadline);
    let mut done = 0;
    while done < 2 {
        let (who, report) = tokio::select! {
            event = events.recv() => event.ok_or("the workers stopped reporting")?,
            () = &mut deadline => return Err("the demo did not finish within 60s".into()),
        };
        say(t0, who, &report.text);
        match (who, report.event) {
            ("worker-a", Event::Granted) => {
                say(t0, "demo", "worker-b starts and waits for the lease");
                b = Some(Worker::start(client, &launch, "worker-b").await?);
            }
            ("worker-a", Event::Paying) => {
                a.pause().await?;
                paused = true;
                say(
                    t0,
                    "demo",
                    &format!(
                        "{} worker-a: a stop-the-world pause, longer than its {LEASE_SECONDS}s lease",
                        a.describe_pause()
                    ),
                );
            }
            ("worker-b", Event::Done) if paused => {
                a.resume().await?;
                paused = false;
                say(
                    t0,
                    "demo",
                    &format!(
                        "{} worker-a: it resumes, still sure it holds its token",
                        a.describe_resume()
                    ),
                );
            }
            ("worker-a", Event::Accepted) => stale_accepted += 1,
            ("worker-a", Event::Refused) => stale_refused += 1,
            ("worker-b", Event::Accepted) => fresh_accepted += 1,
            (_, Event::Failed) => return Err(format!("{who} failed: {}", report.text).into()),
            _ => {}
        }
        if report.event == Event::Done {
            done += 1;
        }
    }
    for worker in [Some(&mut a), b.as_mut()].into_iter().flatten() {
        worker.finish().await?;
    }

    let payouts = db
        .query(
            &format!("SELECT paid_by, fence_token FROM {table} WHERE account = 42 ORDER BY id"),
            &[],
        )
        .await?;
    let paid: Vec<(String, i64)> = payouts.iter().map(|r| (r.get(0), r.get(1))).collect();
    let paid_by = match paid.as_slice() {
        [(by, _)] => Some(by.clone()),
        _ => None,
    };
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
    let payout = configmaps.get("dividend-42-2024q4").await?;
    let cm_paid_by = payout.data.as_ref().and_then(|d| d.get("paidBy").cloned());
    let a_receipt = configmaps.get_opt("receipt-worker-a").await?.is_some();
    println!();
    println!(
        "Ledger: {} payout(s) to account 42 in PostgreSQL: {}; ConfigMap paid by {}; worker-a's receipt {}.",
        paid.len(),
        paid.iter()
            .map(|(by, token)| format!("{by} (token {token})"))
            .collect::<Vec<_>>()
            .join(", "),
        cm_paid_by.as_deref().unwrap_or("nobody"),
        if a_receipt {
            "EXISTS"
        } else {
            "was never written"
        }
    );
    let ok = stale_refused == 4
        && stale_accepted == 0
        && fresh_accepted == 3
        && paid_by.as_deref() == Some("worker-b")
        && cm_paid_by.as_deref() == Some("worker-b")
        && !a_receipt;
    if ok {
        println!(
            "OK: the dividend was paid once. All 4 stale writes of worker-a were refused (3 by the apiserver, a plain delete among them; 1 by PostgreSQL, its insert of a second payout)."
        );
    } else {
        println!(
            "FAILED: worker-a's stale writes: {stale_refused} refused, {stale_accepted} accepted; worker-b's writes accepted: {fresh_accepted} of 3."
        );
        println!("Worker logs: {}", args.log_dir.display());
    }
    Ok(ok)
}
