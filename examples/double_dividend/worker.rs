//! What a worker does: takes the lease, reads the ledger, pays (slowly), and writes the payout
//! with its token to a ConfigMap, a receipt ConfigMap and the PostgreSQL ledger. It reports
//! each step to the demo as a JSON line on its stdout.

use std::time::Duration;

use fenced_lease::fence::kube::stamp;
use fenced_lease::fence::postgres::Scope;
use fenced_lease::holder::{AcquireOptions, acquire};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::AuthInfo;
use kube::{Client, Config};

use super::{Args, Event, LEASE, PAYING, PAYOUT, Report, Result, config_map, epoch_ms, postgres};

/// Takes the lease, reads the ledger, pays (slowly), and writes the payout with its token to a
/// ConfigMap, a receipt ConfigMap and the PostgreSQL row. Reports each step.
pub async fn worker(args: &Args, name: &str) -> Result<bool> {
    let (table, t0) = (
        args.table.clone().ok_or("--table is required")?,
        args.t0_ms.ok_or("--t0-ms is required")?,
    );
    let paying = args.paying_ms.map_or(PAYING, Duration::from_millis);
    let report = |event: Event, text: String| {
        let line = Report {
            at_ms: epoch_ms().saturating_sub(t0),
            event,
            text,
        };
        println!("{}", serde_json::to_string(&line).unwrap_or_default());
    };
    let client = pod_client().await?;
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
            paying.as_secs_f32()
        ),
    );
    tokio::time::sleep(paying).await;

    let configmaps: Api<ConfigMap> = Api::namespaced(client, &args.namespace);
    write_configmaps(&configmaps, name, token, &report).await;
    write_ledger(&mut db, &args.namespace, &table, name, token, &report).await;
    report(Event::Done, "done".into());
    let _ = guard.release().await; // a lost lease has nothing left to release
    Ok(true)
}

/// A client as the worker's pod: its ServiceAccount token, bound to the pod (in a pod, the one
/// its kubelet mounts; else the demo's, in FL_DEMO_TOKEN).
async fn pod_client() -> Result<Client> {
    let mut config = Config::infer().await?;
    if let Ok(token) = std::env::var("FL_DEMO_TOKEN") {
        config.auth_info = AuthInfo {
            token: Some(token.into()),
            ..AuthInfo::default()
        };
    }
    Ok(Client::try_from(config)?)
}

/// Replaces the payout ConfigMap and writes a receipt, both stamped with `token`.
async fn write_configmaps(
    configmaps: &Api<ConfigMap>,
    name: &str,
    token: i64,
    report: &impl Fn(Event, String),
) {
    // A payout found there is a draft of an earlier attempt: it goes first (a plain delete).
    match configmaps.delete(PAYOUT, &DeleteParams::default()).await {
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        deleted => report_kube(
            report,
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
        report,
        &format!("ConfigMap {PAYOUT}"),
        token,
        written.map(drop),
    );
    let receipt_name = format!("receipt-{name}");
    let mut receipt = config_map(&receipt_name, name);
    stamp(&mut receipt, LEASE, token);
    let written = configmaps.create(&PostParams::default(), &receipt).await;
    report_kube(
        report,
        &format!("ConfigMap {receipt_name} (new)"),
        token,
        written.map(drop),
    );
}

/// Appends the payout to the ledger, in a transaction presenting `token` to the ledger's scope
/// (the lease): the ledger is append-only, a payout is a new row.
async fn write_ledger(
    db: &mut tokio_postgres::Client,
    namespace: &str,
    table: &str,
    name: &str,
    token: i64,
    report: &impl Fn(Event, String),
) {
    let written = async {
        let tx = Scope::of_lease(namespace, LEASE).begin(db, token).await?;
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
