//! Keeps one claim alive: heartbeats it every third of the duration in force (jittered
//! retries, per-call timeouts), watches the claim and the lease, and ends the hold at the
//! local safe deadline from a timer of its own. All state changes go through the pure
//! [`Tracker`]. Deleting the claim happens on a task of its own, so that it completes even if
//! whoever asked for it stops waiting.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::watch_object;
use tokio::sync::watch;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

use super::claim::{ClaimView, LeaseView, heartbeat_patch, is_final_phase_refusal};
use super::clock::{self, BootInstant};
use super::error::{Error, LostReason, report};
use super::options::Timing;
use super::state::Tracker;
use crate::api::{ClaimPhase, FencedLease, FencedLeaseClaim};

/// State shared by a claim's background tasks and its guard.
pub(crate) struct Shared {
    pub namespace: String,
    pub lease: String,
    pub claim: String,
    pub identity: String,
    tracker: watch::Sender<Tracker>,
    /// Cancelled when the hold ends (lost or released): stops the tasks.
    pub stop: CancellationToken,
}

impl Shared {
    /// Applies `change` to the tracker; wakes watchers if it changed, stops the tasks if the
    /// hold ended.
    pub fn update(&self, change: impl FnOnce(&mut Tracker) -> bool) {
        self.tracker.send_if_modified(change);
        if !self.tracker.borrow().is_live() {
            self.stop.cancel();
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<Tracker> {
        self.tracker.subscribe()
    }

    pub fn snapshot(&self) -> Tracker {
        self.tracker.borrow().clone()
    }

    /// Pacing for the duration in force.
    pub fn timing(&self) -> Timing {
        self.tracker.borrow().timing()
    }

    /// Ends the hold at once if its deadline has passed at `now` (a reader noticed before
    /// the timer did, e.g. right after the process was resumed from a pause).
    pub fn check_deadline(&self, now: BootInstant) {
        self.update(|t| t.check_deadline(now));
    }
}

#[cfg(test)]
impl Shared {
    /// Shared state around `tracker`, without tasks.
    pub fn for_test(lease: &str, claim: &str, tracker: Tracker) -> Arc<Shared> {
        let shared = Arc::new(Shared {
            namespace: "test".into(),
            lease: lease.into(),
            claim: claim.into(),
            identity: "test".into(),
            tracker: watch::channel(tracker).0,
            stop: CancellationToken::new(),
        });
        shared.update(|_| false);
        shared
    }
}

/// A created claim to keep.
pub(crate) struct Created {
    pub namespace: String,
    pub lease: String,
    pub identity: String,
    /// The claim as the apiserver returned it (or as read back after an uncertain create).
    pub claim: FencedLeaseClaim,
    /// Send time of the first create attempt that may have created it.
    pub first_sent: BootInstant,
    /// `spec.leaseDurationSeconds` read at acquire.
    pub spec_duration: Duration,
    pub margin: Option<Duration>,
    pub call_timeout: Option<Duration>,
}

/// One claim and its background tasks. Dropping it withdraws the claim.
pub(crate) struct Keeper {
    pub shared: Arc<Shared>,
    api: Api<FencedLeaseClaim>,
    /// Delete the claim when dropped.
    armed: bool,
}

impl Keeper {
    /// Starts keeping a created claim.
    pub fn start(client: Client, created: Created) -> Keeper {
        let name = kube::ResourceExt::name_any(&created.claim);
        let mut tracker = Tracker::new(
            &name,
            created.first_sent,
            created.spec_duration,
            created.margin,
            created.call_timeout,
        );
        tracker.heartbeat_ok(
            created.first_sent,
            BootInstant::now(),
            &ClaimView::from(&created.claim),
        );
        let (tx, _) = watch::channel(tracker);
        let shared = Arc::new(Shared {
            namespace: created.namespace.clone(),
            lease: created.lease,
            claim: name,
            identity: created.identity,
            tracker: tx,
            stop: CancellationToken::new(),
        });
        let api: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), &created.namespace);
        tracing::debug!(lease = %shared.lease, claim = %shared.claim, identity = %shared.identity, "keeping claim");
        tokio::spawn(heartbeat(
            shared.clone(),
            api.clone(),
            Api::namespaced(client.clone(), &created.namespace),
        ));
        tokio::spawn(watch_claim(shared.clone(), api.clone()));
        tokio::spawn(watch_lease(
            shared.clone(),
            Api::namespaced(client, &created.namespace),
        ));
        tokio::spawn(deadline_timer(shared.clone()));
        Keeper {
            shared,
            api,
            armed: true,
        }
    }

    /// Ends the hold at once, then deletes the claim so that the next waiter is granted
    /// without waiting for expiry. Cancel-safe: the deletion runs on a task of its own and
    /// completes even if this future is dropped.
    pub async fn discard(mut self, reason: LostReason) -> Result<(), Error> {
        self.shared.update(|t| t.end(reason));
        self.armed = false;
        let (api, claim, timing) = (
            self.api.clone(),
            self.shared.claim.clone(),
            self.shared.timing(),
        );
        let deletion = tokio::spawn(async move { delete_claim(&api, &claim, timing).await });
        deletion.await.unwrap_or_else(|_| {
            Err(Error::Unavailable {
                what: "delete FencedLeaseClaim: the runtime is shutting down".into(),
                source: None,
            })
        })
    }

    /// Stops the background tasks and leaves the claim in place.
    pub fn detach(mut self) {
        self.armed = false;
        self.shared.update(|t| t.end(LostReason::Released));
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.shared.update(|t| t.end(LostReason::Released));
        if !self.armed {
            return;
        }
        let (api, claim, timing) = (
            self.api.clone(),
            self.shared.claim.clone(),
            self.shared.timing(),
        );
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(%claim, "guard dropped outside a Tokio runtime: claim not deleted; it expires instead");
            return;
        };
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let log_claim = claim.clone();
        runtime.spawn(async move {
            if let Err(error) = delete_claim(&api, &log_claim, timing).await {
                tracing::warn!(claim = %log_claim, error = %report(&error), "could not delete claim on drop; it expires instead");
            }
            let _ = done_tx.send(());
        });
        // Wait for the deletion, so that it is done even when the runtime shuts down right
        // after (a guard dropped at the end of `main`). Blocking a worker is allowed only on
        // the multi-threaded runtime; never while unwinding, where a second panic aborts.
        if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
            && !std::thread::panicking()
        {
            let wait = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                tokio::task::block_in_place(|| {
                    let _ = done_rx.recv_timeout(timing.call_timeout + Duration::from_secs(1));
                })
            }));
            if wait.is_err() {
                tracing::debug!(%claim, "cannot block here: claim deleted in the background");
            }
        }
    }
}

async fn delete_claim(
    api: &Api<FencedLeaseClaim>,
    claim: &str,
    timing: Timing,
) -> Result<(), Error> {
    match timeout(
        timing.call_timeout,
        api.delete(claim, &DeleteParams::default()),
    )
    .await
    {
        Err(_) => Err(Error::timed_out(
            "delete FencedLeaseClaim",
            timing.call_timeout,
        )),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => Ok(()),
        Ok(Err(e)) => Err(Error::from_kube("delete FencedLeaseClaim", e)),
    }
}

/// Heartbeats every `renew_every` from the send time of the last accepted one; retries
/// failures with jittered backoff (or the apiserver's Retry-After); never waits for an answer
/// past the deadline while holding. A refusal that cannot change by waiting ends the claim at
/// once: 404 (deleted), 403 (forbidden), 422 from the final-phase rule (expired or revoked).
///
/// A waiting claim whose heartbeats did not get through for longer than its deadline may
/// have been granted, expired and replaced meanwhile. The first heartbeat accepted after
/// such a gap is therefore counted together with a fresh read of the lease made after it:
/// a grant older than what the lease says then is not believed, whichever operator runs.
async fn heartbeat(shared: Arc<Shared>, api: Api<FencedLeaseClaim>, leases: Api<FencedLease>) {
    let mut changes = shared.subscribe();
    let mut last_sent_at = tokio::time::Instant::now();
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
        let sent_at = tokio::time::Instant::now();
        last_sent_at = sent_at;
        shared.check_deadline(sent);
        if shared.stop.is_cancelled() {
            return;
        }
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
            _ = shared.stop.cancelled() => return,
            r = timeout(budget, call) => r,
        };
        let received = BootInstant::now();
        let gap = !holding && sent >= deadline;
        let result = match result {
            Ok(Ok(claim)) if gap => match read_lease(&leases, &shared.lease, timing).await {
                Ok(lease) => Ok(Ok((claim, Some(lease)))),
                Err(error) => Ok(Err(error)),
            },
            Ok(Ok(claim)) => Ok(Ok((claim, None))),
            Ok(Err(e)) => Ok(Err(e)),
            Err(elapsed) => Err(elapsed),
        };
        let error = match result {
            Ok(Ok((claim, lease))) => {
                if failures > 0 {
                    tracing::info!(lease = %shared.lease, claim = %shared.claim, failures, "heartbeat accepted again");
                }
                shared.update(|t| {
                    let seen = lease.is_some_and(|l| t.observe_lease(l.as_ref(), received));
                    t.heartbeat_ok(sent, received, &ClaimView::from(&claim)) || seen
                });
                failures = 0;
                next = sent_at + shared.timing().renew_every;
                continue;
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => {
                shared.update(|t| t.end(LostReason::ClaimDeleted));
                return;
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 403 => {
                tracing::warn!(lease = %shared.lease, claim = %shared.claim, message = %s.message, "heartbeat forbidden");
                shared.update(|t| t.end(LostReason::Forbidden(s.message.clone())));
                return;
            }
            Ok(Err(kube::Error::Api(s))) if is_final_phase_refusal(&s) => {
                let reason = final_reason(&api, &shared.claim, timing).await;
                tracing::warn!(lease = %shared.lease, claim = %shared.claim, %reason, "heartbeat refused: the claim is over");
                shared.update(|t| t.end(reason));
                return;
            }
            Ok(Err(e)) => Error::from_kube("renew FencedLeaseClaim", e),
            Err(_) => Error::timed_out("renew FencedLeaseClaim", budget),
        };
        failures += 1;
        let asked = error
            .retry_after()
            .unwrap_or_default()
            .min(timing.renew_every);
        let pause = timing
            .retry_after(failures, rand::random::<f64>())
            .max(asked);
        // Once per outage at WARN; the retries that follow at DEBUG.
        if failures == 1 {
            tracing::warn!(lease = %shared.lease, claim = %shared.claim, error = %report(&error), ?pause, "heartbeat failed; retrying");
        } else {
            tracing::debug!(lease = %shared.lease, claim = %shared.claim, error = %report(&error), failures, ?pause, "heartbeat failed; retrying");
        }
        next = tokio::time::Instant::now() + pause;
    }
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

/// How watches come back after the API went away: quickly (a holder's deadline is short),
/// 200 ms doubling to 3 s, between half and all of it by chance, so that many holders do not
/// reconnect in step.
const RECONNECT: crate::backoff::Backoff =
    crate::backoff::Backoff::new(Duration::from_millis(200), Duration::from_secs(3), 0.5);

/// [`RECONNECT`] counting the failures since the watch last worked.
#[derive(Debug, Default)]
struct WatchBackoff {
    failures: u32,
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.failures = self.failures.saturating_add(1);
        Some(RECONNECT.pause(self.failures))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.failures = 0;
    }
}

fn watch_backoff() -> WatchBackoff {
    WatchBackoff::default()
}

/// Follows the claim: the grant, the queue position, expiry and revocation, deletion.
async fn watch_claim(shared: Arc<Shared>, api: Api<FencedLeaseClaim>) {
    let events = watch_object(api, &shared.claim).backoff(watch_backoff());
    let mut events = std::pin::pin!(events);
    let mut failing = false;
    loop {
        let event = tokio::select! {
            _ = shared.stop.cancelled() => return,
            e = events.next() => e,
        };
        if matches!(event, Some(Ok(_))) {
            failing = false;
        }
        match event {
            Some(Ok(Some(claim))) => {
                let view = ClaimView::from(&claim);
                shared.update(|t| t.observe_claim(&view, BootInstant::now()));
            }
            Some(Ok(None)) => {
                shared.update(|t| t.end(LostReason::ClaimDeleted));
                return;
            }
            Some(Err(error)) => {
                if !failing {
                    tracing::warn!(claim = %shared.claim, error = %report(&error), "watch on claim failed; retrying");
                } else {
                    tracing::debug!(claim = %shared.claim, error = %report(&error), "watch on claim failed; retrying");
                }
                failing = true;
                continue;
            }
            None => return,
        }
    }
}

/// Follows the lease, the source of truth: the grant shows there first, and so does a newer
/// holder.
async fn watch_lease(shared: Arc<Shared>, api: Api<FencedLease>) {
    let events = watch_object(api, &shared.lease).backoff(watch_backoff());
    let mut events = std::pin::pin!(events);
    let mut failing = false;
    loop {
        let event = tokio::select! {
            _ = shared.stop.cancelled() => return,
            e = events.next() => e,
        };
        if matches!(event, Some(Ok(_))) {
            failing = false;
        }
        match event {
            Some(Ok(lease)) => {
                let view = lease.as_ref().map(LeaseView::from);
                shared.update(|t| t.observe_lease(view.as_ref(), BootInstant::now()));
            }
            Some(Err(error)) => {
                if !failing {
                    tracing::warn!(lease = %shared.lease, error = %report(&error), "watch on lease failed; retrying");
                } else {
                    tracing::debug!(lease = %shared.lease, error = %report(&error), "watch on lease failed; retrying");
                }
                failing = true;
                continue;
            }
            None => return,
        }
    }
}

/// Ends the hold at the deadline, whether or not any other task gets to run.
async fn deadline_timer(shared: Arc<Shared>) {
    let mut rx = shared.subscribe();
    loop {
        let (live, holding, deadline) = {
            let t = rx.borrow_and_update();
            (t.is_live(), t.is_holding(), t.deadline())
        };
        if !live {
            return;
        }
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = clock::sleep_until(deadline), if holding => shared.check_deadline(BootInstant::now()),
            changed = rx.changed() => if changed.is_err() { return },
        }
    }
}
