//! Taking a lease: read it (it must exist), queue a claim under a name of our own, and learn
//! of the grant from a watch (not by polling). Transient API errors are retried with jittered
//! backoff within the wait, keeping the same claim and its place in the queue.

use std::future::Future;
use std::time::Duration;

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

use super::claim::{claim_name, creator_annotations, new_claim};
use super::clock::BootInstant;
use super::error::{Error, LostReason, report};
use super::guard::LeaseGuard;
use super::keeper::{Created, Keeper};
use super::options::{AcquireOptions, PodRef, Timing, default_identity};
use super::state::HoldState;
use crate::api::{ClaimPhase, FencedLease, FencedLeaseClaim};
use crate::backoff::Backoff;

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

/// How long one `acquire` may keep trying.
struct Budget {
    lease: String,
    started: Instant,
    give_up: Option<Instant>,
    /// A zero wait: one try, no retries.
    once: bool,
    cancel: CancellationToken,
}

impl Budget {
    /// The budget `options` give a wait for `lease`, starting now.
    fn new(lease: &str, options: &AcquireOptions) -> Self {
        Budget {
            lease: lease.into(),
            started: Instant::now(),
            give_up: options.wait.map(|w| Instant::now() + w),
            once: options.wait == Some(Duration::ZERO),
            cancel: options.cancel.clone().unwrap_or_default(),
        }
    }

    fn timed_out(&self) -> Error {
        Error::Timeout {
            lease: self.lease.clone(),
            waited: self.started.elapsed(),
        }
    }

    fn cancelled(&self) -> Error {
        Error::Cancelled {
            lease: self.lease.clone(),
        }
    }

    fn over(&self) -> bool {
        self.give_up.is_some_and(|at| Instant::now() >= at)
    }

    /// One API call with a timeout; `Err(Cancelled)` if the caller cancels meanwhile.
    async fn call<T>(
        &self,
        what: &str,
        call_timeout: Duration,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<Result<T, Error>, Error> {
        tokio::select! {
            r = timeout(call_timeout, call) => Ok(match r {
                Ok(result) => result.map_err(|e| Error::from_kube(what, e)),
                Err(_) => Err(Error::timed_out(what, call_timeout)),
            }),
            _ = self.cancel.cancelled() => Err(self.cancelled()),
        }
    }

    /// Waits before retry `attempt` after `error`; `Err` (the error itself) when the wait
    /// would end first, or `Err(Cancelled)`.
    async fn pause(&self, attempt: u32, error: Error) -> Result<(), Error> {
        if self.once || !error.is_transient() {
            return Err(error);
        }
        let pause = WAIT_BACKOFF
            .pause(attempt)
            .max(error.retry_after().unwrap_or_default().min(MAX_PAUSE));
        if self.give_up.is_some_and(|at| Instant::now() + pause >= at) {
            return Err(error);
        }
        // Once per outage at WARN; the retries that follow at DEBUG.
        if attempt == 1 {
            tracing::warn!(lease = %self.lease, error = %report(&error), ?pause, "API request failed; retrying until the wait is over");
        } else {
            tracing::debug!(lease = %self.lease, error = %report(&error), attempt, ?pause, "API request failed; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => Ok(()),
            _ = self.cancel.cancelled() => Err(self.cancelled()),
        }
    }

    /// Calls until an answer, retrying transient failures within the wait.
    async fn retry<T, F, Fut>(
        &self,
        what: &str,
        call_timeout: Duration,
        mut call: F,
    ) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let mut attempt = 0;
        loop {
            match self.call(what, call_timeout, call()).await? {
                Ok(value) => return Ok(value),
                Err(error) => {
                    attempt += 1;
                    self.pause(attempt, error).await?;
                }
            }
        }
    }
}

/// The per-call timeout of requests made before the lease's duration is known, unless
/// [`AcquireOptions`] set one.
const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest pause between retries while waiting.
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// Pauses between retries while waiting: 200 ms doubling to 5 s, between half and all of it
/// by chance, so that a fleet does not stampede a recovering apiserver.
const WAIT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), MAX_PAUSE, 0.5);

/// Creating this holder's claim.
struct ClaimRequest<'a> {
    api: &'a Api<FencedLeaseClaim>,
    lease: &'a str,
    identity: &'a str,
    pod: Option<&'a PodRef>,
    /// Where this holder learns who the apiserver takes it for (`SelfSubjectReview`).
    reviews: Api<SelfSubjectReview>,
    /// Its creator annotations, learned once per acquire and stamped on every claim it makes.
    creator: tokio::sync::OnceCell<BTreeMap<String, String>>,
    call_timeout: Duration,
}

impl ClaimRequest<'_> {
    /// Creates a claim under a fresh name; returns it and the send time of the first attempt
    /// that may have created it. A create whose answer was lost (timeout, connection reset,
    /// 5xx) is tried again under the same name: 409 then means an earlier attempt created it,
    /// and that claim is adopted (it keeps its place). Giving up, the claim is deleted by name
    /// in case it exists.
    async fn create(&self, budget: &Budget) -> Result<(FencedLeaseClaim, BootInstant), Error> {
        let creator = self.creator(budget).await?;
        let mut name = claim_name(self.lease);
        let mut first_sent: Option<BootInstant> = None;
        let mut attempt = 0;
        let outcome = loop {
            let sent = BootInstant::now();
            let claim = new_claim(
                &name,
                self.lease,
                self.identity,
                self.pod,
                creator,
                Timestamp::now(),
            );
            let params = PostParams::default();
            let result = match budget
                .call(
                    "create FencedLeaseClaim",
                    self.call_timeout,
                    self.api.create(&params, &claim),
                )
                .await
            {
                Ok(result) => result,
                Err(cancelled) => {
                    // The request may have reached the apiserver.
                    first_sent.get_or_insert(sent);
                    break Err(cancelled);
                }
            };
            let error = match result {
                Ok(created) => return Ok((created, first_sent.unwrap_or(sent))),
                Err(error) => error,
            };
            if is_conflict(&error) {
                if first_sent.is_some() {
                    match self.adopt(&name, budget).await {
                        Ok(Some(existing)) => {
                            tracing::info!(claim = %name, "an earlier create had succeeded; keeping that claim");
                            return Ok((existing, first_sent.unwrap_or(sent)));
                        }
                        Ok(None) => {}
                        Err(error) => break Err(error),
                    }
                }
                // Not ours, or over: another name.
                name = claim_name(self.lease);
                first_sent = None;
                continue;
            }
            if error.is_transient() {
                first_sent.get_or_insert(sent);
            }
            attempt += 1;
            if let Err(error) = budget.pause(attempt, error).await {
                break Err(error);
            }
        };
        if first_sent.is_some() {
            self.withdraw(&name).await;
        }
        outcome
    }

    /// The creator annotations of this holder's claims (I7): its username and, from a pod,
    /// the pod's name and UID, as the apiserver authenticates it — a `SelfSubjectReview`,
    /// which every authenticated user may create. The claim-ownership policy refuses a claim
    /// whose annotations are not those of its creator's request.
    async fn creator(&self, budget: &Budget) -> Result<&BTreeMap<String, String>, Error> {
        self.creator
            .get_or_try_init(|| async {
                let (params, ask) = (PostParams::default(), SelfSubjectReview::default());
                let review = budget
                    .retry("create SelfSubjectReview", self.call_timeout, || {
                        self.reviews.create(&params, &ask)
                    })
                    .await?;
                Ok(creator_annotations(&review))
            })
            .await
    }

    /// The claim `name` that an earlier attempt may have created, if it is this holder's
    /// and not over; a claim of ours that is over is deleted.
    async fn adopt(&self, name: &str, budget: &Budget) -> Result<Option<FencedLeaseClaim>, Error> {
        let found = budget
            .retry("get FencedLeaseClaim", self.call_timeout, || {
                self.api.get_opt(name)
            })
            .await?;
        let Some(found) = found else {
            return Ok(None);
        };
        if found.spec.lease_name != self.lease || found.spec.holder_identity != self.identity {
            return Ok(None);
        }
        let phase = found.status.as_ref().and_then(|s| s.phase);
        if matches!(phase, Some(ClaimPhase::Expired | ClaimPhase::Revoked)) {
            self.withdraw(name).await;
            return Ok(None);
        }
        Ok(Some(found))
    }

    /// Deletes claim `name` if it exists (best effort: a claim nobody heartbeats is expired
    /// by the operator).
    async fn withdraw(&self, name: &str) {
        let deleted = timeout(
            self.call_timeout,
            self.api.delete(name, &DeleteParams::default()),
        )
        .await;
        match deleted {
            Ok(Ok(_)) => {
                tracing::info!(claim = %name, "withdrew a claim whose create was uncertain")
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => {}
            Ok(Err(e)) => {
                tracing::warn!(claim = %name, error = %report(&e), "could not withdraw a claim whose create was uncertain")
            }
            Err(_) => {
                tracing::warn!(claim = %name, "could not withdraw a claim whose create was uncertain: no answer")
            }
        }
    }
}

fn is_conflict(error: &Error) -> bool {
    matches!(error, Error::Kube { source, .. }
        if source.downcast_ref::<kube::core::Status>().is_some_and(|s| s.code == 409))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_retries_back_off_to_five_seconds_with_jitter() {
        assert_eq!(WAIT_BACKOFF.delay(1, 1.0), Duration::from_millis(200));
        assert_eq!(WAIT_BACKOFF.delay(1, 0.0), Duration::from_millis(100));
        assert_eq!(WAIT_BACKOFF.delay(3, 1.0), Duration::from_millis(800));
        assert_eq!(WAIT_BACKOFF.delay(30, 1.0), Duration::from_secs(5));
    }
}
