//! Fenced leader election: lead while holding the lease, with the token to stamp on every
//! write and a cancellation tied to the lease; campaign again after every loss or step-down,
//! until the caller shuts the election down.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::watch_object;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::acquire::acquire;
use super::error::{Error, report};
use super::guard::{LeaseGuard, LeaseHandle};
use super::options::{AcquireOptions, default_identity};
use crate::api::FencedLease;
use crate::backoff::Backoff;

/// Options of [`elect`]. Build them with the methods below.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ElectOptions {
    /// Identity, pod, margin and request timeout of each candidacy (`wait` and `cancel`
    /// are not used). The identity defaults to [`default_identity`], unique per process.
    pub acquire: AcquireOptions,
    /// Stops the election: the current term ends, the lease is released, `elect` returns.
    pub shutdown: CancellationToken,
    /// Where to report leadership changes, if anywhere.
    pub leadership: Option<watch::Sender<Leadership>>,
}

impl ElectOptions {
    /// An election that runs until `shutdown` is cancelled.
    pub fn new(shutdown: CancellationToken) -> Self {
        ElectOptions {
            shutdown,
            ..Default::default()
        }
    }

    /// Sets the options of each candidacy.
    pub fn acquire(mut self, acquire: AcquireOptions) -> Self {
        self.acquire = acquire;
        self
    }

    /// Sets this candidate's identity.
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.acquire = self.acquire.identity(identity);
        self
    }

    /// Reports leadership changes on `sender`, like client-go's `OnStartedLeading`,
    /// `OnStoppedLeading` and `OnNewLeader` callbacks.
    pub fn leadership(mut self, sender: watch::Sender<Leadership>) -> Self {
        self.leadership = Some(sender);
        self
    }
}

/// Who leads, as an election sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leadership {
    /// Identity of the leader the lease's status names; `None` when nobody leads.
    pub leader: Option<String>,
    /// While this candidate leads: the token of its term.
    pub leading: Option<i64>,
}

/// Runs for leadership of `lease` until `options.shutdown` is cancelled, then returns
/// `Ok(())` (having released the lease if it led).
///
/// Each time the lease is granted, `lead` is called with a [`LeaseHandle`]: stamp
/// `handle.token()?` on every write, and tie background work to `handle.cancellation()`.
/// When the lease is lost, the handle's cancellation fires, the future returned by `lead` is
/// dropped, and the candidate campaigns again. When that future completes on its own, the
/// leader steps down (an `Err` is logged as such): the lease is released and the candidate
/// campaigns again after a short pause. Campaign failures that may pass (API unavailable)
/// are retried with jittered backoff.
///
/// Returns `Err` only when campaigning cannot succeed without a person: the lease does not
/// exist, RBAC forbids, or the options are invalid.
pub async fn elect<F, Fut, E>(
    client: Client,
    namespace: &str,
    lease: &str,
    options: ElectOptions,
    mut lead: F,
) -> Result<(), Error>
where
    F: FnMut(LeaseHandle) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    let shutdown = options.shutdown.clone();
    let identity = options
        .acquire
        .identity
        .clone()
        .unwrap_or_else(default_identity);
    // Follows the lease's holder for "the leader is now X", as long as the election runs.
    let follow = shutdown.child_token();
    let _stop_following = follow.clone().drop_guard();
    if let Some(tx) = options.leadership.clone() {
        let api: Api<FencedLease> = Api::namespaced(client.clone(), namespace);
        tokio::spawn(follow_leader(api, lease.to_string(), tx, follow));
    }

    let mut failures = 0u32;
    loop {
        let candidacy = candidacy(&options, &identity);
        let guard = match acquire(client.clone(), namespace, lease, candidacy).await {
            Ok(guard) => guard,
            Err(Error::Cancelled { .. }) => return Ok(()),
            Err(
                error @ (Error::LeaseNotFound { .. }
                | Error::Forbidden { .. }
                | Error::InvalidMargin { .. }),
            ) => return Err(error),
            Err(error) => {
                failures += 1;
                let pause = CAMPAIGN_BACKOFF.pause(failures);
                tracing::warn!(lease, error = %report(&error), ?pause, "candidacy failed; retrying");
                if !sleep_unless_shut_down(pause, &shutdown).await {
                    return Ok(());
                }
                continue;
            }
        };
        failures = 0;
        let candidate = Candidate {
            lease,
            identity: &identity,
            shutdown: &shutdown,
            leadership: options.leadership.as_ref(),
        };
        match candidate.serve(guard, &mut lead).await {
            Term::Shutdown => {
                tracing::info!(lease, "stopped leading: shutting down");
                return Ok(());
            }
            Term::Lost(reason) => {
                tracing::warn!(lease, %reason, "stopped leading: lease lost; campaigning again");
            }
            Term::SteppedDown(error) => {
                match error {
                    None => tracing::info!(lease, "stepped down; campaigning again"),
                    Some(error) => {
                        tracing::error!(lease, %error, "leading failed; stepped down, campaigning again")
                    }
                }
                if !sleep_unless_shut_down(CAMPAIGN_BACKOFF.pause(1), &shutdown).await {
                    return Ok(());
                }
            }
        }
    }
}

/// The options of one candidacy: waits until granted or shut down.
fn candidacy(options: &ElectOptions, identity: &str) -> AcquireOptions {
    let mut candidacy = options
        .acquire
        .clone()
        .identity(identity)
        .cancel(options.shutdown.clone());
    candidacy.wait = None;
    candidacy
}

/// Sleeps for `pause`; `false` if the election is shut down first.
async fn sleep_unless_shut_down(pause: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(pause) => true,
        _ = shutdown.cancelled() => false,
    }
}

/// This candidate, as it leads one term.
struct Candidate<'a> {
    lease: &'a str,
    identity: &'a str,
    shutdown: &'a CancellationToken,
    leadership: Option<&'a watch::Sender<Leadership>>,
}

impl Candidate<'_> {
    /// Leads while `guard` holds the lease: runs `lead` until it ends, the lease is lost or
    /// the election shuts down, then releases the lease.
    async fn serve<F, Fut, E>(&self, guard: LeaseGuard, lead: &mut F) -> Term
    where
        F: FnMut(LeaseHandle) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: Display,
    {
        let lease = self.lease;
        let handle = guard.handle();
        let token = handle.granted_token();
        tracing::info!(lease, claim = handle.claim(), identity = %self.identity, token = ?token, "started leading");
        self.report(|l| {
            let now = Leadership {
                leader: Some(self.identity.to_string()),
                leading: token,
            };
            std::mem::replace(l, now.clone()) != now
        });
        let ended = tokio::select! {
            biased;
            _ = self.shutdown.cancelled() => Term::Shutdown,
            reason = handle.lost() => Term::Lost(reason.to_string()),
            result = lead(handle.clone()) => match handle.token() {
                // `lead` ended because it saw the lease go: a loss, not a step-down.
                Err(error) => Term::Lost(error.to_string()),
                Ok(_) => Term::SteppedDown(result.err().map(|e| e.to_string())),
            },
        };
        if let Err(error) = guard.release().await {
            tracing::warn!(lease, error = %report(&error), "could not delete claim; it expires instead");
        }
        self.report(|l| std::mem::take(&mut l.leading).is_some());
        ended
    }

    /// Applies `change` to the leadership reported, if reported; wakes the receivers when it
    /// says it changed something.
    fn report(&self, change: impl FnOnce(&mut Leadership) -> bool) {
        if let Some(tx) = self.leadership {
            tx.send_if_modified(change);
        }
    }
}

/// How a term ended.
enum Term {
    Shutdown,
    Lost(String),
    SteppedDown(Option<String>),
}

/// Reports the holder named by the lease's status until `stop`.
async fn follow_leader(
    api: Api<FencedLease>,
    lease: String,
    tx: watch::Sender<Leadership>,
    stop: CancellationToken,
) {
    let events = watch_object(api, &lease).default_backoff();
    let mut events = std::pin::pin!(events);
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            e = events.next() => e,
        };
        match event {
            Some(Ok(found)) => {
                let leader = found
                    .and_then(|l| l.status)
                    .and_then(|s| s.holder)
                    .map(|h| h.identity);
                tx.send_if_modified(|l| {
                    let changed = l.leader != leader;
                    l.leader = leader.clone();
                    changed
                });
            }
            Some(Err(error)) => {
                tracing::debug!(%lease, error = %report(&error), "watch on lease failed; retrying")
            }
            None => return,
        }
    }
}

/// Pauses between candidacies after a failure or a step-down: 1 s doubling to 30 s, between
/// half and all of it by chance, so that a fleet does not stampede a recovering apiserver.
const CAMPAIGN_BACKOFF: Backoff =
    Backoff::new(Duration::from_secs(1), Duration::from_secs(30), 0.5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidacy_retries_back_off_to_half_a_minute() {
        assert_eq!(CAMPAIGN_BACKOFF.delay(1, 1.0), Duration::from_secs(1));
        assert_eq!(CAMPAIGN_BACKOFF.delay(2, 1.0), Duration::from_secs(2));
        assert_eq!(CAMPAIGN_BACKOFF.delay(10, 1.0), Duration::from_secs(30));
        assert_eq!(CAMPAIGN_BACKOFF.delay(10, 0.0), Duration::from_secs(15));
    }
}
