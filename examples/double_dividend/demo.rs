//! The demo: the lease and the workers' rights set up, worker-a started, paused in the middle
//! of paying, worker-b granted the lease meanwhile, worker-a resumed; the timeline printed, and
//! the ledger checked at the end.

use std::time::{Duration, Instant};

use fenced_lease::api::FencedLease;
use fenced_lease::fence::postgres::Scope;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;

use super::launch::{Launch, Worker};
use super::{
    Args, Event, LEASE, LEASE_SECONDS, PAYING, PAYING_IN_A_POD, Report, Result, WORKER_ACCOUNT,
    config_map, epoch_ms, postgres, wait_until,
};

/// What the demo saw of the workers' writes.
#[derive(Clone, Copy, Default)]
struct Tally {
    /// worker-a's writes after its pause, refused and accepted.
    stale_refused: usize,
    stale_accepted: usize,
    /// worker-b's writes accepted.
    fresh_accepted: usize,
}

fn say(t0: Instant, who: &str, text: &str) {
    println!(
        "  {:>6.2}s  {who:<9} {text}",
        t0.elapsed().as_secs_f64(),
        who = who
    );
}

pub async fn demo(args: &Args) -> Result<bool> {
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
    let tally = timeline(args, client, table).await?;
    verdict(args, client, db, table, &tally).await
}

/// An error when a report that a worker pays reached the demo after the payment ended: a
/// pause now would come too late to show anything.
fn in_time(t0_ms: u128, report: &Report, paying: Duration) -> Result<()> {
    let late = epoch_ms()
        .saturating_sub(t0_ms)
        .saturating_sub(report.at_ms);
    if late >= paying.as_millis() {
        return Err(format!(
            "worker-a's report that it pays reached the demo {late} ms late, after its {}s \
             payment had ended: too late to pause it (a slow log stream?)",
            paying.as_secs_f32()
        )
        .into());
    }
    Ok(())
}

/// worker-a started; worker-b once worker-a holds the lease; worker-a paused while it pays and
/// resumed once worker-b is done. Each report printed as it comes; the writes counted.
async fn timeline(args: &Args, client: &Client, table: &str) -> Result<Tally> {
    let (t0, t0_ms) = (Instant::now(), epoch_ms());
    let (tx, mut events) = mpsc::unbounded_channel();
    let postgres_url = std::env::var("FL_POSTGRES_URL").unwrap_or_default();
    let launch = Launch {
        namespace: &args.namespace,
        table,
        t0_ms,
        paying: if args.pods.is_some() {
            PAYING_IN_A_POD
        } else {
            PAYING
        },
        log_dir: &args.log_dir,
        image: args.pods.as_deref(),
        postgres_url: args.pods_postgres_url.as_deref().unwrap_or(&postgres_url),
        events: tx,
    };
    let mut a = Worker::start(client, &launch, "worker-a").await?;
    let mut b: Option<Worker> = None;
    let mut tally = Tally::default();
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
                in_time(t0_ms, &report, launch.paying)?;
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
            ("worker-a", Event::Accepted) => tally.stale_accepted += 1,
            ("worker-a", Event::Refused) => tally.stale_refused += 1,
            ("worker-b", Event::Accepted) => tally.fresh_accepted += 1,
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
    Ok(tally)
}

/// The ledger and the ConfigMaps as the workers left them: paid once, by worker-b, and every
/// stale write of worker-a refused?
async fn verdict(
    args: &Args,
    client: &Client,
    db: &tokio_postgres::Client,
    table: &str,
    tally: &Tally,
) -> Result<bool> {
    let Tally {
        stale_refused,
        stale_accepted,
        fresh_accepted,
    } = *tally;
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
