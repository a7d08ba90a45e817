//! Keeps one claim alive with tasks of its own: the [heartbeat](mod@heartbeat) every third of
//! the duration in force, the [watches](mod@watches) on the claim and the lease, and a timer
//! that ends the hold at the local safe deadline. All state changes go through the pure [`Tracker`]. Deleting the
//! claim happens on a task of its own, so that it completes even if whoever asked for it
//! stops waiting.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, DeleteParams};
use tokio::sync::watch;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

use super::claim::{CREATED_BY, CREATED_BY_POD, ClaimView};
use super::clock::{self, BootInstant};
use super::error::{Error, LostReason, report};
use super::options::Timing;
use super::refusals::Reporter;
use super::state::Tracker;
use crate::api::{FencedLease, FencedLeaseClaim};

mod heartbeat;
mod watches;

use heartbeat::heartbeat;
use watches::{watch_claim, watch_lease};

/// State shared by a claim's background tasks and its guard.
pub(crate) struct Shared {
    pub namespace: String,
    pub lease: String,
    pub claim: String,
    pub identity: String,
    /// Reports the refusals of this holder's writes ([`super::refusals`]).
    pub reports: Arc<Reporter>,
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
            reports: Reporter::new(None, "test", lease, "test", Duration::from_secs(1)),
            tracker: watch::channel(tracker).0,
            stop: CancellationToken::new(),
        });
        shared.update(|_| false);
        shared
    }
}

/// Who reports this claim's refusals ([`Reporter`]): its creator's pod as the apiserver
/// authenticated it (the claim's creator annotations, I7), else its username, else the holder
/// identity. The refusal-reports policy admits a holder's report only under its own name.
fn reporting_instance(claim: &FencedLeaseClaim, identity: &str) -> String {
    let annotations = claim.metadata.annotations.as_ref();
    let creator = |key| annotations.and_then(|a| a.get(key)).cloned();
    creator(CREATED_BY_POD)
        .or_else(|| creator(CREATED_BY))
        .unwrap_or_else(|| identity.to_string())
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
    /// The lease as `acquire` read it while the claim was created (`None`: read it again).
    pub lease_read: Option<FencedLease>,
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
        let call_timeout = tracker.timing().call_timeout;
        let (tx, _) = watch::channel(tracker);
        let reports = Reporter::new(
            Some(client.clone()),
            &created.namespace,
            &created.lease,
            &reporting_instance(&created.claim, &created.identity),
            call_timeout,
        );
        let shared = Arc::new(Shared {
            namespace: created.namespace.clone(),
            lease: created.lease,
            claim: name,
            identity: created.identity,
            reports,
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
        tokio::spawn(watch_claim(
            shared.clone(),
            api.clone(),
            Some(created.claim),
        ));
        tokio::spawn(watch_lease(
            shared.clone(),
            Api::namespaced(client, &created.namespace),
            created.lease_read,
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
