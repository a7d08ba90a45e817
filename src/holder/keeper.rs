//! Keeps one claim alive: creates it, heartbeats it every leaseDuration/3 (jittered retries,
//! per-call timeouts), watches the claim and the lease, and ends the hold at the local safe
//! deadline from a timer of its own. All state changes go through the pure [`Tracker`].

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::watch_object;
use tokio::sync::watch;
use tokio::time::{sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use super::claim::{ClaimView, LeaseView, heartbeat_patch, new_claim};
use super::error::{Error, LostReason};
use super::options::{PodRef, Timing};
use super::state::Tracker;
use crate::api::{FencedLease, FencedLeaseClaim};

/// State shared by a claim's background tasks and its guard.
pub(crate) struct Shared {
    pub namespace: String,
    pub lease: String,
    pub claim: String,
    pub identity: String,
    pub timing: Timing,
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

    /// Ends the hold at once if its deadline has passed at `now` (a reader noticed before
    /// the timer did, e.g. right after the process was resumed from a pause).
    pub fn check_deadline(&self, now: Instant) {
        self.update(|t| t.check_deadline(now));
    }
}

/// One claim and its background tasks. Dropping it withdraws the claim (best effort).
pub(crate) struct Keeper {
    pub shared: Arc<Shared>,
    api: Api<FencedLeaseClaim>,
    /// Delete the claim when dropped.
    armed: bool,
}

impl Keeper {
    /// Creates a fresh claim on `lease` and starts keeping it.
    pub async fn start(
        client: Client,
        namespace: &str,
        lease: &str,
        identity: &str,
        pod: Option<&PodRef>,
        timing: Timing,
    ) -> Result<Keeper, Error> {
        let api: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), namespace);
        let claim = new_claim(lease, identity, pod, Timestamp::now());
        let sent = Instant::now();
        let created = timeout(
            timing.call_timeout,
            api.create(&PostParams::default(), &claim),
        )
        .await
        .map_err(|_| Error::timed_out("create FencedLeaseClaim", timing.call_timeout))?
        .map_err(|e| Error::from_kube("create FencedLeaseClaim", e))?;
        let received = Instant::now();
        let name = created
            .metadata
            .name
            .clone()
            .ok_or_else(|| Error::Unavailable {
                what: "the apiserver returned a claim without a name".into(),
                source: None,
            })?;
        let mut tracker = Tracker::new(sent, timing);
        tracker.heartbeat_ok(sent, received, &ClaimView::from(&created));
        let (tx, _) = watch::channel(tracker);
        let shared = Arc::new(Shared {
            namespace: namespace.into(),
            lease: lease.into(),
            claim: name,
            identity: identity.into(),
            timing,
            tracker: tx,
            stop: CancellationToken::new(),
        });
        tracing::debug!(lease, claim = %shared.claim, identity, "claim created");
        tokio::spawn(heartbeat(shared.clone(), api.clone()));
        tokio::spawn(watch_claim(shared.clone(), api.clone()));
        tokio::spawn(watch_lease(
            shared.clone(),
            Api::namespaced(client, namespace),
        ));
        tokio::spawn(deadline_timer(shared.clone()));
        Ok(Keeper {
            shared,
            api,
            armed: true,
        })
    }

    /// Ends the hold and deletes the claim, so the next waiter is granted at once.
    pub async fn discard(mut self, reason: LostReason) -> Result<(), Error> {
        self.armed = false;
        self.shared.update(|t| t.end(reason));
        delete_claim(&self.api, &self.shared.claim, self.shared.timing).await
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
            self.shared.timing,
        );
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if let Err(error) = delete_claim(&api, &claim, timing).await {
                        tracing::warn!(%claim, %error, "could not delete claim on drop; it expires instead");
                    }
                });
            }
            Err(_) => tracing::warn!(
                claim = %self.shared.claim,
                "guard dropped outside a Tokio runtime: claim not deleted; it expires instead"
            ),
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

/// Heartbeats every `renew_every` from the send time of the last counted one; retries
/// failures with jittered backoff; never waits for an answer past the deadline.
async fn heartbeat(shared: Arc<Shared>, api: Api<FencedLeaseClaim>) {
    let timing = shared.timing;
    let mut next = Instant::now() + timing.renew_every;
    let mut failures = 0u32;
    loop {
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = sleep_until(next.into()) => {}
        }
        let sent = Instant::now();
        shared.check_deadline(sent);
        let deadline = shared.snapshot().deadline;
        if shared.stop.is_cancelled() {
            return;
        }
        let budget = timing
            .call_timeout
            .min(deadline.saturating_duration_since(sent));
        let (params, patch) = (
            PatchParams::default(),
            Patch::Merge(heartbeat_patch(Timestamp::now())),
        );
        let call = api.patch(&shared.claim, &params, &patch);
        let result = tokio::select! {
            _ = shared.stop.cancelled() => return,
            r = timeout(budget, call) => r,
        };
        let received = Instant::now();
        let error = match result {
            Ok(Ok(claim)) => {
                shared.update(|t| t.heartbeat_ok(sent, received, &ClaimView::from(&claim)));
                failures = 0;
                next = sent + timing.renew_every;
                continue;
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => {
                shared.update(|t| t.end(LostReason::ClaimDeleted));
                return;
            }
            Ok(Err(e)) => Error::from_kube("renew", e),
            Err(_) => Error::timed_out("renew", budget),
        };
        failures += 1;
        let pause = timing.retry_after(failures, rand::random::<f64>());
        tracing::warn!(lease = %shared.lease, claim = %shared.claim, %error, failures, "heartbeat failed; retrying");
        next = Instant::now() + pause;
    }
}

/// Follows the claim: the grant, the queue position, expiry and revocation, deletion.
async fn watch_claim(shared: Arc<Shared>, api: Api<FencedLeaseClaim>) {
    let events = watch_object(api, &shared.claim).default_backoff();
    let mut events = std::pin::pin!(events);
    loop {
        let event = tokio::select! {
            _ = shared.stop.cancelled() => return,
            e = events.next() => e,
        };
        match event {
            Some(Ok(Some(claim))) => {
                let view = ClaimView::from(&claim);
                shared.update(|t| t.observe_claim(&view, Instant::now()));
            }
            Some(Ok(None)) => {
                shared.update(|t| t.end(LostReason::ClaimDeleted));
                return;
            }
            Some(Err(error)) => {
                tracing::warn!(claim = %shared.claim, %error, "watch on claim failed; retrying")
            }
            None => return,
        }
    }
}

/// Follows the lease, the source of truth: the grant shows there first, and so does a newer
/// holder.
async fn watch_lease(shared: Arc<Shared>, api: Api<FencedLease>) {
    let events = watch_object(api, &shared.lease).default_backoff();
    let mut events = std::pin::pin!(events);
    loop {
        let event = tokio::select! {
            _ = shared.stop.cancelled() => return,
            e = events.next() => e,
        };
        match event {
            Some(Ok(lease)) => {
                let view = lease.as_ref().map(LeaseView::from);
                shared.update(|t| t.observe_lease(view.as_ref(), &shared.claim, Instant::now()));
            }
            Some(Err(error)) => {
                tracing::warn!(lease = %shared.lease, %error, "watch on lease failed; retrying")
            }
            None => return,
        }
    }
}

/// Ends the hold at the deadline, whether or not any other task gets to run.
async fn deadline_timer(shared: Arc<Shared>) {
    let mut rx = shared.subscribe();
    loop {
        let deadline = {
            let t = rx.borrow_and_update();
            if !t.is_live() {
                return;
            }
            t.deadline
        };
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = sleep_until(deadline.into()) => shared.check_deadline(Instant::now()),
            changed = rx.changed() => if changed.is_err() { return },
        }
    }
}
