//! Taking a lease: check that it exists, queue a fresh claim, and learn of the grant from a
//! watch (not by polling).

use std::future::pending;
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::Api;
use tokio::time::{sleep_until, timeout};

use super::error::{Error, LostReason};
use super::guard::LeaseGuard;
use super::keeper::Keeper;
use super::options::{AcquireOptions, PodRef, Timing, default_identity};
use super::state::HoldState;
use crate::api::FencedLease;

/// Longest wait for the first read of the lease.
const LEASE_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Waits until `lease` in `namespace` is granted to a fresh claim of this holder, and returns
/// the guard that keeps it. On timeout or cancellation the claim is withdrawn.
///
/// A claim that stalls while queued (its heartbeats not answered before its local deadline,
/// or expired by the operator) is replaced by a fresh one at the back of the queue.
pub async fn acquire(
    client: Client,
    namespace: &str,
    lease: &str,
    options: AcquireOptions,
) -> Result<LeaseGuard, Error> {
    let started = Instant::now();
    let give_up = options.wait.map(|w| started + w);
    let cancel = options.cancel.clone().unwrap_or_default();
    let timed_out = || Error::Timeout {
        lease: lease.into(),
        waited: started.elapsed(),
    };
    let cancelled = || Error::Cancelled {
        lease: lease.into(),
    };
    let until_given_up = async {
        match give_up {
            Some(at) => sleep_until(at.into()).await,
            None => pending().await,
        }
    };
    let mut until_given_up = std::pin::pin!(until_given_up);

    let timing = tokio::select! {
        t = lease_timing(&client, namespace, lease, options.margin) => t?,
        _ = &mut until_given_up => return Err(timed_out()),
        _ = cancel.cancelled() => return Err(cancelled()),
    };
    let identity = options.identity.clone().unwrap_or_else(default_identity);
    let pod = options.pod.clone().or_else(|| PodRef::from_env(namespace));

    loop {
        let keeper = tokio::select! {
            k = Keeper::start(client.clone(), namespace, lease, &identity, pod.as_ref(), timing) => k?,
            _ = &mut until_given_up => return Err(timed_out()),
            _ = cancel.cancelled() => return Err(cancelled()),
        };
        let mut rx = keeper.shared.subscribe();
        loop {
            let state = rx.borrow_and_update().state.clone();
            match state {
                HoldState::Holding { token } => {
                    tracing::info!(lease, claim = %keeper.shared.claim, token, waited = ?started.elapsed(), "lease granted");
                    return Ok(LeaseGuard::new(keeper));
                }
                HoldState::Lost { reason, .. } if reason.is_stall() => {
                    tracing::warn!(lease, claim = %keeper.shared.claim, %reason, "queued claim stalled; queueing a fresh one");
                    discard(keeper, reason).await;
                    break;
                }
                HoldState::Lost { reason, token } => {
                    discard(keeper, reason.clone()).await;
                    return Err(match reason {
                        LostReason::LeaseDeleted => Error::LeaseNotFound {
                            namespace: namespace.into(),
                            lease: lease.into(),
                        },
                        reason => Error::Lost {
                            lease: lease.into(),
                            token,
                            reason,
                        },
                    });
                }
                HoldState::Waiting { .. } => {}
            }
            tokio::select! {
                _ = rx.changed() => {}
                _ = &mut until_given_up => {
                    discard(keeper, LostReason::Released).await;
                    return Err(timed_out());
                }
                _ = cancel.cancelled() => {
                    discard(keeper, LostReason::Released).await;
                    return Err(cancelled());
                }
            }
        }
    }
}

/// Withdraws a claim; if that fails the claim expires on its own (no more heartbeats).
async fn discard(keeper: Keeper, reason: LostReason) {
    let claim = keeper.shared.claim.clone();
    if let Err(error) = keeper.discard(reason).await {
        tracing::warn!(%claim, %error, "could not delete claim; it expires instead");
    }
}

/// Reads the lease (it must exist) and derives the heartbeat pacing from its duration.
async fn lease_timing(
    client: &Client,
    namespace: &str,
    lease: &str,
    margin: Option<Duration>,
) -> Result<Timing, Error> {
    let api: Api<FencedLease> = Api::namespaced(client.clone(), namespace);
    let found = timeout(LEASE_READ_TIMEOUT, api.get_opt(lease))
        .await
        .map_err(|_| Error::timed_out("get FencedLease", LEASE_READ_TIMEOUT))?
        .map_err(|e| Error::from_kube("get FencedLease", e))?;
    let Some(found) = found else {
        return Err(Error::LeaseNotFound {
            namespace: namespace.into(),
            lease: lease.into(),
        });
    };
    let seconds = u64::try_from(found.spec.lease_duration_seconds.max(1)).unwrap_or(1);
    Ok(Timing::new(Duration::from_secs(seconds), margin))
}
