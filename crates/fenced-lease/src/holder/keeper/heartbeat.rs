//! The heartbeat of a kept claim: sent every `renew_every` from the send time of the last
//! accepted one, each answer counted by the [`Tracker`].

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use tokio::time::{Instant, timeout};

use super::Shared;
use crate::api::{ClaimPhase, FencedLease, FencedLeaseClaim};
use crate::holder::claim::{ClaimView, LeaseView, heartbeat_patch, is_final_phase_refusal};
use crate::holder::clock::BootInstant;
use crate::holder::error::{Error, LostReason, report};
use crate::holder::options::Timing;
use crate::holder::state::Tracker;

/// Heartbeats every `renew_every` from the send time of the last accepted one; retries
/// failures with jittered backoff (or the apiserver's Retry-After); never waits for an answer
/// past the deadline while holding. A refusal that cannot change by waiting ends the claim at
/// once: 404 (deleted), 403 (forbidden), 422 from the final-phase rule (expired or revoked).
///
/// A waiting claim whose heartbeats did not get through for longer than its deadline may
/// have been granted, expired and replaced meanwhile. The first heartbeat accepted after
/// such a gap is therefore counted together with a fresh read of the lease made after it:
/// a grant older than what the lease says then is not believed, whichever operator runs.
pub(super) async fn heartbeat(
    shared: Arc<Shared>,
    api: Api<FencedLeaseClaim>,
    leases: Api<FencedLease>,
) {
    let mut changes = shared.subscribe();
    let mut last_sent_at = Instant::now();
    let mut next = last_sent_at + shared.timing().renew_every;
    let mut failures = 0u32;
    loop {
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = tokio::time::sleep_until(next) => {}
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                // The duration in force can shorten while this sleeps: a claim that queued on
                // a longer `spec.leaseDurationSeconds` is granted a shorter term (I10). Pace
                // on the term from now on, or the next beat comes after the term's end.
                next = next.min(last_sent_at + shared.timing().renew_every);
                continue;
            }
        }
        let sent = BootInstant::now();
        last_sent_at = Instant::now();
        shared.check_deadline(sent);
        if shared.stop.is_cancelled() {
            return;
        }
        let (error, timing) = match beat(&shared, &api, &leases, sent).await {
            Beat::Accepted(accepted) => {
                if failures > 0 {
                    tracing::info!(lease = %shared.lease, claim = %shared.claim, failures, "heartbeat accepted again");
                }
                shared.update(|t| accepted.count(t, sent));
                failures = 0;
                next = last_sent_at + shared.timing().renew_every;
                continue;
            }
            Beat::Ended => return,
            Beat::Failed { error, timing } => (error, timing),
        };
        failures += 1;
        let pause = retry_pause(&shared, &error, timing, failures);
        next = Instant::now() + pause;
    }
}

/// What became of one heartbeat.
enum Beat {
    Accepted(Box<Accepted>),
    /// The hold ended (refused for good, or stopped meanwhile).
    Ended,
    /// Failed in a way that may pass; `timing` is the pacing it was sent with.
    Failed {
        error: Error,
        timing: Timing,
    },
}

/// An accepted heartbeat's answer.
struct Accepted {
    claim: FencedLeaseClaim,
    /// The lease as read right after the heartbeat, when one was due after a gap (`Some(None)`:
    /// deleted).
    lease: Option<Option<LeaseView>>,
    received: BootInstant,
}

impl Accepted {
    /// Counts this answer to a heartbeat sent at `sent`; whether the tracker changed.
    fn count(self, t: &mut Tracker, sent: BootInstant) -> bool {
        let seen = self
            .lease
            .is_some_and(|l| t.observe_lease(l.as_ref(), self.received));
        t.heartbeat_ok(sent, self.received, &ClaimView::from(&self.claim)) || seen
    }
}

/// Sends the heartbeat sent at `sent` and reads the lease after it when that is due; ends the
/// claim on a refusal that waiting cannot change.
async fn beat(
    shared: &Shared,
    api: &Api<FencedLeaseClaim>,
    leases: &Api<FencedLease>,
    sent: BootInstant,
) -> Beat {
    let (timing, holding, deadline) = {
        let t = shared.snapshot();
        (t.timing(), t.is_holding(), t.deadline())
    };
    let budget = if holding {
        timing
            .call_timeout
            .min(deadline.saturating_duration_since(sent))
    } else {
        timing.call_timeout
    };
    let (params, patch) = (
        PatchParams::default(),
        Patch::Merge(heartbeat_patch(Timestamp::now())),
    );
    let call = api.patch(&shared.claim, &params, &patch);
    let result = tokio::select! {
        _ = shared.stop.cancelled() => return Beat::Ended,
        r = timeout(budget, call) => r,
    };
    let received = BootInstant::now();
    let gap = !holding && sent >= deadline;
    let result = match result {
        Ok(Ok(claim)) if gap => match read_lease(leases, &shared.lease, timing).await {
            Ok(lease) => Ok(Ok((claim, Some(lease)))),
            Err(error) => Ok(Err(error)),
        },
        Ok(Ok(claim)) => Ok(Ok((claim, None))),
        Ok(Err(e)) => Ok(Err(e)),
        Err(elapsed) => Err(elapsed),
    };
    let error = match result {
        Ok(Ok((claim, lease))) => {
            return Beat::Accepted(Box::new(Accepted {
                claim,
                lease,
                received,
            }));
        }
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => {
            shared.update(|t| t.end(LostReason::ClaimDeleted));
            return Beat::Ended;
        }
        Ok(Err(kube::Error::Api(s))) if s.code == 403 => {
            tracing::warn!(lease = %shared.lease, claim = %shared.claim, message = %s.message, "heartbeat forbidden");
            shared.update(|t| t.end(LostReason::Forbidden(s.message.clone())));
            return Beat::Ended;
        }
        Ok(Err(kube::Error::Api(s))) if is_final_phase_refusal(&s) => {
            let reason = final_reason(api, &shared.claim, timing).await;
            tracing::warn!(lease = %shared.lease, claim = %shared.claim, %reason, "heartbeat refused: the claim is over");
            shared.update(|t| t.end(reason));
            return Beat::Ended;
        }
        Ok(Err(e)) => Error::from_kube("renew FencedLeaseClaim", e),
        Err(_) => Error::timed_out("renew FencedLeaseClaim", budget),
    };
    Beat::Failed { error, timing }
}

/// The pause before retrying after failure number `failures` (the apiserver's Retry-After if
/// longer, up to a renew period); says so, once per outage at WARN, then at DEBUG.
fn retry_pause(
    shared: &Shared,
    error: &Error,
    timing: Timing,
    failures: u32,
) -> std::time::Duration {
    let asked = error
        .retry_after()
        .unwrap_or_default()
        .min(timing.renew_every);
    let pause = timing
        .retry_after(failures, rand::random::<f64>())
        .max(asked);
    if failures == 1 {
        tracing::warn!(lease = %shared.lease, claim = %shared.claim, error = %report(error), ?pause, "heartbeat failed; retrying");
    } else {
        tracing::debug!(lease = %shared.lease, claim = %shared.claim, error = %report(error), failures, ?pause, "heartbeat failed; retrying");
    }
    pause
}

/// The lease as it is now (`None`: deleted).
async fn read_lease(
    leases: &Api<FencedLease>,
    lease: &str,
    timing: Timing,
) -> Result<Option<LeaseView>, kube::Error> {
    match timeout(timing.call_timeout, leases.get_opt(lease)).await {
        Ok(read) => read.map(|found| found.as_ref().map(LeaseView::from)),
        Err(_) => Err(kube::Error::Service(
            format!(
                "no answer within {}",
                humantime::format_duration(timing.call_timeout)
            )
            .into(),
        )),
    }
}

/// Why a claim whose heartbeat the final-phase rule refused is over: `Revoked` if a read says
/// so, else `Expired`.
async fn final_reason(api: &Api<FencedLeaseClaim>, claim: &str, timing: Timing) -> LostReason {
    let read = timeout(timing.call_timeout, api.get_opt(claim)).await;
    let status = match read {
        Ok(Ok(Some(c))) => c.status,
        _ => None,
    };
    match status {
        Some(s) if s.phase == Some(ClaimPhase::Revoked) => {
            LostReason::Revoked(s.message.unwrap_or_default())
        }
        _ => LostReason::Expired,
    }
}
