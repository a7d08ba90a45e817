//! `status`, `list`, `acquire` and `release`: one short API exchange each.

use std::time::Duration;

use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;

use super::report::{self, LeaseReport};
use super::{Failure, HolderArgs, Output, exit, failure};
use crate::api::{FencedLease, FencedLeaseClaim};
use crate::holder::{AcquireOptions, Error, acquire, default_identity};

/// Per-call timeout of the CLI's own reads and deletes.
const API_TIMEOUT: Duration = Duration::from_secs(30);

async fn read<T>(
    what: &str,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Err(_) => Err(Error::timed_out(what, API_TIMEOUT).into()),
        Ok(result) => result.map_err(|e| Error::from_kube(what, e).into()),
    }
}

fn print<T: Serialize>(
    value: &T,
    output: Output,
    table: impl FnOnce() -> String,
) -> Result<(), Failure> {
    let text = match output {
        Output::Table => table(),
        Output::Json => serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(|e| failure(e.to_string()))?,
        Output::Yaml => serde_saphyr::to_string(value).map_err(|e| failure(e.to_string()))?,
    };
    print!("{text}");
    Ok(())
}

pub(super) async fn status(
    client: Client,
    namespace: &str,
    lease: &str,
    output: Output,
) -> Result<u8, Failure> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), namespace);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client, namespace);
    let Some(found) = read("get FencedLease", leases.get_opt(lease)).await? else {
        return Err(Error::LeaseNotFound {
            namespace: namespace.into(),
            lease: lease.into(),
        }
        .into());
    };
    let claims = read(
        "list FencedLeaseClaims",
        claims.list(&ListParams::default()),
    )
    .await?;
    let report = LeaseReport::new(&found, &claims.items);
    let now = k8s_openapi::jiff::Timestamp::now();
    print(&report, output, || report.detail(now))?;
    Ok(exit::OK)
}

pub(super) async fn list(client: Client, namespace: &str, output: Output) -> Result<u8, Failure> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), namespace);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client, namespace);
    let leases = read("list FencedLeases", leases.list(&ListParams::default())).await?;
    let claims = read(
        "list FencedLeaseClaims",
        claims.list(&ListParams::default()),
    )
    .await?;
    let reports: Vec<LeaseReport> = leases
        .items
        .iter()
        .map(|l| LeaseReport::new(l, &claims.items))
        .collect();
    let now = k8s_openapi::jiff::Timestamp::now();
    print(&reports, output, || {
        if reports.is_empty() {
            eprintln!("No FencedLeases in namespace {namespace}.");
            String::new()
        } else {
            report::list_table(&reports, now)
        }
    })?;
    Ok(exit::OK)
}

pub(super) fn acquire_options(holder: &HolderArgs) -> AcquireOptions {
    AcquireOptions {
        identity: holder.identity.clone(),
        wait: holder.wait,
        ..Default::default()
    }
}

/// A token that is cancelled on SIGINT, SIGTERM or SIGHUP.
fn interrupt_token() -> tokio_util::sync::CancellationToken {
    let token = tokio_util::sync::CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let _ = super::run::next_signal().await;
        cancel.cancel();
    });
    token
}

pub(super) async fn acquire_and_leave(
    client: Client,
    namespace: &str,
    lease: &str,
    holder: HolderArgs,
    output: Output,
) -> Result<u8, Failure> {
    let options = acquire_options(&holder).cancel(interrupt_token());
    let guard = acquire(client, namespace, lease, options).await?;
    let claim = guard.detach();
    print(&claim, output, || {
        format!("{}\n", claim.token.map_or("-".into(), |t| t.to_string()))
    })?;
    if output == Output::Table {
        eprintln!(
            "Acquired {lease} (claim {}). Nothing renews it now: it expires {} after this unless released first with `kubectl fence release {lease}`.",
            claim.claim,
            humantime::format_duration(claim.lease_duration)
        );
    }
    Ok(exit::OK)
}

pub(super) async fn release(
    client: Client,
    namespace: &str,
    lease: &str,
    identity: Option<String>,
    claim: Option<String>,
) -> Result<u8, Failure> {
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client, namespace);
    let identity = identity.unwrap_or_else(default_identity);
    let listed = read(
        "list FencedLeaseClaims",
        claims.list(&ListParams::default()),
    )
    .await?;
    let targets: Vec<FencedLeaseClaim> = listed
        .items
        .into_iter()
        .filter(|c| c.spec.lease_name == lease)
        .filter(|c| match &claim {
            Some(name) => c.name_any() == *name,
            None => c.spec.holder_identity == identity,
        })
        .collect();
    if targets.is_empty() {
        eprintln!(
            "No claims on {lease} for {}: nothing to release.",
            claim.map_or(format!("identity {identity}"), |c| format!("claim {c}"))
        );
        return Ok(exit::OK);
    }
    for c in targets {
        let name = c.name_any();
        match read(
            "delete FencedLeaseClaim",
            claims.delete(&name, &DeleteParams::default()),
        )
        .await
        {
            Ok(_) => {}
            Err(f) if f.message.contains("not found") => {}
            Err(f) => return Err(f),
        }
        let token = c.status.as_ref().and_then(|s| s.fencing_token);
        match token {
            Some(t) => println!("released claim {name} (token {t})"),
            None => println!("withdrew claim {name}"),
        }
    }
    Ok(exit::OK)
}
