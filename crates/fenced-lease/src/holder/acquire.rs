//! Taking a lease: read it (it must exist), queue a claim under a name of our own, and learn
//! of the grant from a watch (not by polling). Transient API errors are retried with jittered
//! backoff within the wait, keeping the same claim and its place in the queue.

use std::time::Duration;

use kube::api::Api;
use kube::{Client, ResourceExt};
use tokio::time::Instant;

use super::budget::Budget;
use super::create::ClaimRequest;
use super::error::{Error, LostReason, report};
use super::guard::LeaseGuard;
use super::keeper::{Created, Keeper};
use super::options::{AcquireOptions, PodRef, Timing, default_identity};
use super::state::HoldState;
use crate::api::{FencedLease, FencedLeaseClaim};

/// Waits until `lease` in `namespace` is granted to a claim of this holder, and returns the
/// guard that keeps it. On timeout or cancellation the claim is withdrawn.
///
/// While waiting, API errors that may pass (connection refused, timeouts, 5xx, 429) are
/// retried with jittered backoff until the wait is over, and the claim keeps its place in
/// the queue. A 403 is returned as [`Error::Forbidden`] at once. A queued claim that the
/// operator expires (its heartbeats were not seen for a lease duration) is replaced by a
/// fresh one at the back of the queue.
pub async fn acquire(
    client: Client,
    namespace: &str,
    lease: &str,
    options: AcquireOptions,
) -> Result<LeaseGuard, Error> {
    let budget = Budget::new(lease, &options);
    let identity = options.identity.clone().unwrap_or_else(default_identity);
    let pod = options.pod.clone().or_else(|| PodRef::from_env(namespace));
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), namespace);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), namespace);
    let mut request = ClaimRequest {
        api: &claims,
        lease,
        identity: &identity,
        pod: pod.as_ref(),
        reviews: Api::all(client.clone()),
        creator: tokio::sync::OnceCell::new(),
        // Until the lease is read, requests are paced as for the longest lease there can be.
        call_timeout: options.request_timeout.unwrap_or(DEFAULT_READ_TIMEOUT),
    };
    // The lease is read while the first claim is created, not before: a round trip less. A
    // claim made for a lease that turns out missing, or too short for the margin, is withdrawn.
    let (read, first) = tokio::join!(
        lease_duration(&leases, namespace, &options, &budget),
        request.create(&budget)
    );
    let (spec_duration, mut lease_read) = match read {
        Ok((duration, lease)) => (duration, Some(lease)),
        Err(error) => {
            if let Ok((claim, _)) = &first {
                request.withdraw(&claim.name_any()).await;
            }
            return Err(error);
        }
    };
    let timing =
        Timing::new(spec_duration, options.margin).with_call_timeout(options.request_timeout);
    request.call_timeout = timing.call_timeout;
    let mut first = Some(first);
    loop {
        let (claim, first_sent) = match first.take() {
            Some(created) => created?,
            None => request.create(&budget).await?,
        };
        let keeper = Keeper::start(
            client.clone(),
            Created {
                namespace: namespace.into(),
                lease: lease.into(),
                identity: identity.clone(),
                claim,
                first_sent,
                spec_duration,
                margin: options.margin,
                call_timeout: options.request_timeout,
                // The lease as read starts the first claim's watch only: it is older for the next.
                lease_read: lease_read.take(),
            },
        );
        // Never give up before the operator has answered the claim once (or one request
        // timeout has passed): that is what makes a zero wait "take it if it is free".
        let answer_by = Instant::now() + timing.call_timeout;
        if let Some(guard) = await_grant(keeper, &budget, answer_by).await? {
            return Ok(guard);
        }
    }
}

/// Reads the lease, which must exist, and returns its `spec.leaseDurationSeconds` and the
/// lease as read, once the margin asked for is known to be shorter.
async fn lease_duration(
    leases: &Api<FencedLease>,
    namespace: &str,
    options: &AcquireOptions,
    budget: &Budget,
) -> Result<(Duration, FencedLease), Error> {
    let lease = budget.lease.as_str();
    let read_timeout = options.request_timeout.unwrap_or(DEFAULT_READ_TIMEOUT);
    let found = budget
        .retry("get FencedLease", read_timeout, || leases.get_opt(lease))
        .await?;
    let Some(found) = found else {
        return Err(Error::LeaseNotFound {
            namespace: namespace.into(),
            lease: lease.into(),
        });
    };
    let spec_duration = found.spec.lease_duration();
    if let Some(margin) = options.margin.filter(|m| *m >= spec_duration) {
        return Err(Error::InvalidMargin {
            margin,
            duration: spec_duration,
        });
    }
    Ok((spec_duration, found))
}

/// Follows a queued claim until it is granted (`Some`), or is over in a way a fresh claim
/// may mend (`None`: queue again), or the wait ends (`Err`). A claim not granted is
/// withdrawn. The wait never ends before `answer_by` unless the operator has answered.
async fn await_grant(
    keeper: Keeper,
    budget: &Budget,
    answer_by: Instant,
) -> Result<Option<LeaseGuard>, Error> {
    let lease = budget.lease.as_str();
    let shared = keeper.shared.clone();
    let mut rx = shared.subscribe();
    loop {
        let (state, answered) = {
            let t = rx.borrow_and_update();
            (t.state.clone(), t.answered())
        };
        match state {
            HoldState::Holding { token } => {
                tracing::info!(lease, claim = %shared.claim, token, waited_ms = budget.started.elapsed().as_millis(), "lease granted");
                return Ok(Some(LeaseGuard::new(keeper)));
            }
            // Expired while queued, or granted and replaced while its heartbeats could not
            // get through: queue again.
            HoldState::Lost {
                reason,
                token: None,
            } if reason.is_stall() || matches!(reason, LostReason::Superseded { .. }) => {
                tracing::warn!(lease, claim = %shared.claim, %reason, "queued claim is over; queueing a fresh one");
                discard(keeper, reason).await;
                if budget.over() {
                    return Err(budget.timed_out());
                }
                return Ok(None);
            }
            HoldState::Lost { reason, token } => {
                discard(keeper, reason.clone()).await;
                return Err(lost_error(&shared.namespace, lease, reason, token));
            }
            HoldState::Waiting { .. } => {}
        }
        let give_up = budget
            .give_up
            .map(|at| if answered { at } else { at.max(answer_by) });
        tokio::select! {
            _ = rx.changed() => {}
            _ = sleep_until(give_up) => {
                discard(keeper, LostReason::Released).await;
                return Err(budget.timed_out());
            }
            _ = budget.cancel.cancelled() => {
                discard(keeper, LostReason::Released).await;
                return Err(budget.cancelled());
            }
        }
    }
}

/// The error `acquire` returns for a claim that is over for `reason` before it was held.
fn lost_error(namespace: &str, lease: &str, reason: LostReason, token: Option<i64>) -> Error {
    match reason {
        LostReason::LeaseDeleted => Error::LeaseNotFound {
            namespace: namespace.into(),
            lease: lease.into(),
        },
        LostReason::Forbidden(message) => Error::Forbidden {
            what: "renew FencedLeaseClaim".into(),
            source: message.into(),
        },
        LostReason::MarginTooLarge { term, margin } => Error::InvalidMargin {
            margin,
            duration: term,
        },
        reason => Error::Lost {
            lease: lease.into(),
            token,
            reason,
        },
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Withdraws a claim; if that fails the claim expires on its own (no more heartbeats).
async fn discard(keeper: Keeper, reason: LostReason) {
    let claim = keeper.shared.claim.clone();
    if let Err(error) = keeper.discard(reason).await {
        tracing::warn!(%claim, error = %report(&error), "could not delete claim; it expires instead");
    }
}

/// The per-call timeout of requests made before the lease's duration is known, unless
/// [`AcquireOptions`] set one.
const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);
