//! `status`, `list`, `acquire` and `release`: one short API exchange each.

use std::time::Duration;

use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use nix::sys::signal::Signal;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::refusals::{self, RefusalReport};
use super::report::{self, LeaseReport};
use super::signals::{Signals, is_terminating, stop_self};
use super::{AcquireFormat, Failure, HolderArgs, NameFormat, ReportFormat, exit, failure};
use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use fenced_lease::holder::{AcquireOptions, Error, LeaseGuard, acquire};

/// Default per-call timeout of the CLI's own reads and deletes.
const API_TIMEOUT: Duration = Duration::from_secs(30);

/// `kind.group/` of claims, as `kubectl get -o name` prints them.
const CLAIM_NAME_PREFIX: &str = "fencedleaseclaim.fencing.dev/";
/// `kind.group/` of leases.
pub(super) const LEASE_NAME_PREFIX: &str = "fencedlease.fencing.dev/";

pub(super) async fn read<T>(
    what: &str,
    timeout: Option<Duration>,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, Failure> {
    let timeout = timeout.unwrap_or(API_TIMEOUT);
    match tokio::time::timeout(timeout, call).await {
        Err(_) => Err(Error::timed_out(what, timeout).into()),
        Ok(result) => result.map_err(|e| Error::from_kube(what, e).into()),
    }
}

pub(super) fn print_as<T: Serialize>(value: &T, json: bool) -> Result<(), Failure> {
    let text = if json {
        serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(|e| failure(e.to_string()))?
    } else {
        serde_saphyr::to_string(value).map_err(|e| failure(e.to_string()))?
    };
    print!("{text}");
    Ok(())
}

/// FencedLease `lease` of `leases`' namespace; its absence is [`Error::LeaseNotFound`].
pub(super) async fn get_lease(
    leases: &Api<FencedLease>,
    lease: &str,
    timeout: Option<Duration>,
) -> Result<FencedLease, Failure> {
    match read("get FencedLease", timeout, leases.get_opt(lease)).await? {
        Some(found) => Ok(found),
        None => Err(Error::LeaseNotFound {
            namespace: leases.namespace().unwrap_or_default().into(),
            lease: lease.into(),
        }
        .into()),
    }
}

pub(super) async fn status(
    client: Client,
    namespace: &str,
    lease: &str,
    output: Option<ReportFormat>,
    timeout: Option<Duration>,
) -> Result<u8, Failure> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), namespace);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), namespace);
    let found = get_lease(&leases, lease, timeout).await?;
    let all = ListParams::default();
    let (claims, events) = tokio::join!(
        read("list FencedLeaseClaims", timeout, claims.list(&all)),
        refusals::read(client, namespace, lease, timeout.unwrap_or(API_TIMEOUT)),
    );
    let report = LeaseReport::new(&found, &claims?.items);
    let now = k8s_openapi::jiff::Timestamp::now();
    let refused = || refusals::detail(events.as_deref(), now);
    let structured = Status {
        refused: events.as_deref().and_then(RefusalReport::of),
        report: report.clone(),
    };
    match output {
        None => print!("{}{}", report.detail(now, false), refused()),
        Some(ReportFormat::Wide) => print!("{}{}", report.detail(now, true), refused()),
        Some(ReportFormat::Name) => println!("{LEASE_NAME_PREFIX}{}", report.name),
        Some(ReportFormat::Json) => print_as(&structured, true)?,
        Some(ReportFormat::Yaml) => print_as(&structured, false)?,
    }
    Ok(exit::OK)
}

/// `status -o json|yaml`: the lease's report and its last refusal.
#[derive(Serialize)]
struct Status {
    #[serde(flatten)]
    report: LeaseReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    refused: Option<RefusalReport>,
}

/// `namespace`: `None` lists every namespace (`-A`).
pub(super) async fn list(
    client: Client,
    namespace: Option<&str>,
    output: Option<ReportFormat>,
    timeout: Option<Duration>,
) -> Result<u8, Failure> {
    let (leases, claims): (Api<FencedLease>, Api<FencedLeaseClaim>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    let leases = read(
        "list FencedLeases",
        timeout,
        leases.list(&ListParams::default()),
    )
    .await?;
    let claims = read(
        "list FencedLeaseClaims",
        timeout,
        claims.list(&ListParams::default()),
    )
    .await?;
    let reports: Vec<LeaseReport> = leases
        .items
        .iter()
        .map(|l| {
            let same_namespace: Vec<FencedLeaseClaim> = claims
                .items
                .iter()
                .filter(|c| c.namespace() == l.namespace())
                .cloned()
                .collect();
            LeaseReport::new(l, &same_namespace)
        })
        .collect();
    let now = k8s_openapi::jiff::Timestamp::now();
    match output {
        None | Some(ReportFormat::Wide) => {
            if reports.is_empty() {
                match namespace {
                    Some(ns) => eprintln!("No FencedLeases in namespace {ns}."),
                    None => eprintln!("No FencedLeases found."),
                }
            } else {
                let columns = report::Columns {
                    namespace: namespace.is_none(),
                    wide: output == Some(ReportFormat::Wide),
                };
                print!("{}", report::list_table(&reports, now, columns));
            }
        }
        Some(ReportFormat::Name) => {
            for r in &reports {
                println!("{LEASE_NAME_PREFIX}{}", r.name);
            }
        }
        Some(ReportFormat::Json) => print_as(&reports, true)?,
        Some(ReportFormat::Yaml) => print_as(&reports, false)?,
    }
    Ok(exit::OK)
}

fn acquire_options(holder: &HolderArgs, timeout: Option<Duration>) -> AcquireOptions {
    let mut options = AcquireOptions::default();
    if let Some(identity) = &holder.identity {
        options = options.identity(identity.clone());
    }
    if let Some(wait) = holder.wait {
        options = options.wait(wait);
    }
    if let Some(timeout) = timeout {
        options = options.request_timeout(timeout);
    }
    options
}

/// How a wait for the lease ended.
pub(super) enum Waited {
    /// Granted: the guard that holds the lease.
    Granted(Box<LeaseGuard>),
    /// A terminating signal ended it (the claim withdrawn): exit with this code, 128 + N.
    Signalled(u8),
}

/// Waits for `lease` as `holder` asks while listening to `signals`: a terminating signal
/// withdraws the claim and ends the wait; Ctrl-Z stops this process meanwhile.
pub(super) async fn acquire_or_signal(
    client: Client,
    namespace: &str,
    lease: &str,
    holder: &HolderArgs,
    timeout: Option<Duration>,
    signals: &mut Signals,
) -> Result<Waited, Failure> {
    let cancel = CancellationToken::new();
    let options = acquire_options(holder, timeout).cancel(cancel.clone());
    let waiting = acquire(client, namespace, lease, options);
    let mut waiting = std::pin::pin!(waiting);
    loop {
        tokio::select! {
            result = &mut waiting => return Ok(Waited::Granted(Box::new(result?))),
            sig = signals.recv() => {
                if is_terminating(sig) {
                    cancel.cancel();
                    // Let acquire withdraw its claim before ending.
                    let _ = waiting.await;
                    return Ok(Waited::Signalled(exit::for_signal(sig)));
                }
                if sig == Signal::SIGTSTP {
                    stop_self();
                }
            }
        }
    }
}

pub(super) async fn acquire_and_leave(
    client: Client,
    namespace: &str,
    lease: &str,
    holder: &HolderArgs,
    output: Option<AcquireFormat>,
    timeout: Option<Duration>,
) -> Result<u8, Failure> {
    let mut signals = Signals::new();
    let guard =
        match acquire_or_signal(client, namespace, lease, holder, timeout, &mut signals).await? {
            Waited::Granted(guard) => *guard,
            Waited::Signalled(code) => return Ok(code),
        };
    let claim = guard.detach();
    match output {
        None => println!("{}", claim.token.map_or("-".into(), |t| t.to_string())),
        Some(AcquireFormat::Name) => println!("{CLAIM_NAME_PREFIX}{}", claim.claim),
        Some(AcquireFormat::Json) => print_as(&claim, true)?,
        Some(AcquireFormat::Yaml) => print_as(&claim, false)?,
    }
    if output.is_none() {
        eprintln!(
            "Acquired {lease} (claim {claim_name}). Nothing renews it now: it expires {} after this unless released first with `kubectl fence release {lease} {claim_name}`.",
            humantime::format_duration(claim.lease_duration),
            claim_name = claim.claim,
        );
    }
    Ok(exit::OK)
}

/// Which claims `release` deletes.
pub(super) enum Which {
    /// These, by name.
    Claims(Vec<String>),
    /// Every claim on the lease, or every one of `identity`.
    All { identity: Option<String> },
}

pub(super) async fn release(
    client: Client,
    namespace: &str,
    lease: &str,
    which: Which,
    output: Option<NameFormat>,
    timeout: Option<Duration>,
) -> Result<u8, Failure> {
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client, namespace);
    let targets = to_release(&claims, namespace, lease, &which, timeout).await?;
    // With --all, a claim the apiserver will not let this user (or pod) release — a sibling
    // pod's, under the claim-ownership policy — is reported and the others are still released.
    let mut refused = 0;
    for c in targets {
        let name = c.name_any();
        // Delete exactly the claim that was read (a new claim of the same name is another).
        let params = DeleteParams {
            preconditions: c.uid().map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match read(
            "delete FencedLeaseClaim",
            timeout,
            claims.delete(&name, &params),
        )
        .await
        {
            Ok(_) => {}
            Err(f) if f.message.contains("not found") => continue,
            Err(f) if f.code == exit::FORBIDDEN && matches!(which, Which::All { .. }) => {
                eprintln!("claim {name} not released: {}", f.message);
                refused += 1;
                continue;
            }
            Err(f) => return Err(f),
        }
        let token = c.status.as_ref().and_then(|s| s.fencing_token);
        match (output, token) {
            (Some(NameFormat::Name), _) => println!("{CLAIM_NAME_PREFIX}{name}"),
            (None, Some(t)) => println!("released claim {name} (token {t})"),
            (None, None) => println!("withdrew claim {name}"),
        }
    }
    match refused {
        0 => Ok(exit::OK),
        n => Err(Failure {
            code: exit::FORBIDDEN,
            message: format!(
                "{n} claim(s) on {lease} not released: the apiserver refused (another pod's or user's claim, see above)"
            ),
        }),
    }
}

/// The claims on `lease` that `release` deletes, as read now; a claim named that does not
/// exist is reported and skipped.
async fn to_release(
    claims: &Api<FencedLeaseClaim>,
    namespace: &str,
    lease: &str,
    which: &Which,
    timeout: Option<Duration>,
) -> Result<Vec<FencedLeaseClaim>, Failure> {
    Ok(match which {
        Which::Claims(names) => {
            let mut found = Vec::new();
            for name in names {
                let name = name.strip_prefix(CLAIM_NAME_PREFIX).unwrap_or(name);
                match read("get FencedLeaseClaim", timeout, claims.get_opt(name)).await? {
                    Some(c) if c.spec.lease_name == lease => found.push(c),
                    Some(c) => {
                        return Err(failure(format!(
                            "claim {name} is on lease {}, not {lease}",
                            c.spec.lease_name
                        )));
                    }
                    None => {
                        eprintln!("No claim {name} in namespace {namespace}: nothing to release.")
                    }
                }
            }
            found
        }
        Which::All { identity } => {
            let listed = read(
                "list FencedLeaseClaims",
                timeout,
                claims.list(&ListParams::default()),
            )
            .await?;
            let found: Vec<FencedLeaseClaim> = listed
                .items
                .into_iter()
                .filter(|c| c.spec.lease_name == lease)
                .filter(|c| {
                    identity
                        .as_ref()
                        .is_none_or(|i| c.spec.holder_identity == *i)
                })
                .collect();
            if found.is_empty() {
                eprintln!(
                    "No claims on {lease}{}: nothing to release.",
                    identity
                        .as_ref()
                        .map_or(String::new(), |i| format!(" for identity {i}"))
                );
            }
            found
        }
    })
}
