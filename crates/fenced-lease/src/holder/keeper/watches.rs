//! The kept claim's watches: on the claim (the grant, the queue position, expiry and
//! revocation, deletion) and on the lease, the source of truth. Each first watches from the
//! version `acquire` already has (the claim as created, the lease as read meanwhile), not from a
//! list of its own: two round trips less beside the operator's grant. Both come back quickly
//! after the API went away, since a holder's deadline is short.

use std::fmt::Debug;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, WatchEvent, WatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::watch_object;
use serde::de::DeserializeOwned;

use super::Shared;
use crate::api::{FencedLease, FencedLeaseClaim};
use crate::backoff::Backoff;
use crate::holder::claim::{ClaimView, LeaseView};
use crate::holder::clock::BootInstant;
use crate::holder::error::{LostReason, report};

/// Follows the claim, first from `seed` (as created): the grant, the queue position, expiry
/// and revocation, deletion.
pub(super) async fn watch_claim(
    shared: Arc<Shared>,
    api: Api<FencedLeaseClaim>,
    seed: Option<FencedLeaseClaim>,
) {
    follow(
        &shared,
        api,
        &shared.claim,
        "claim",
        seed,
        |claim| match claim {
            Some(claim) => {
                let view = ClaimView::from(&claim);
                shared.update(|t| t.observe_claim(&view, BootInstant::now()));
                ControlFlow::Continue(())
            }
            None => {
                shared.update(|t| t.end(LostReason::ClaimDeleted));
                ControlFlow::Break(())
            }
        },
    )
    .await;
}

/// Follows the lease, first from `seed` (as read, if just now), the source of truth: the grant
/// shows there first, and so does a newer holder.
pub(super) async fn watch_lease(
    shared: Arc<Shared>,
    api: Api<FencedLease>,
    seed: Option<FencedLease>,
) {
    follow(&shared, api, &shared.lease, "lease", seed, |lease| {
        let view = lease.as_ref().map(LeaseView::from);
        shared.update(|t| t.observe_lease(view.as_ref(), BootInstant::now()));
        ControlFlow::Continue(())
    })
    .await;
}

/// Follows object `name` of `kind` until the hold ends, handing each state of it (`None`:
/// deleted) to `seen` until it breaks: from `seed` on, if given, then (and after that watch
/// ends or fails) a list and a watch. A failed watch is retried with [`Reconnect`]; the
/// first failure of an outage is logged at WARN, the ones that follow at DEBUG.
async fn follow<K>(
    shared: &Shared,
    api: Api<K>,
    name: &str,
    kind: &str,
    seed: Option<K>,
    mut seen: impl FnMut(Option<K>) -> ControlFlow<()>,
) where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    if let Some(seed) = seed {
        let followed = tokio::select! {
            _ = shared.stop.cancelled() => return,
            followed = follow_from(&api, name, seed, &mut seen) => followed,
        };
        match followed {
            Ok(ControlFlow::Break(())) => return,
            Ok(ControlFlow::Continue(())) => {}
            Err(error) => {
                tracing::debug!(lease = %shared.lease, claim = %shared.claim, error = %report(&error), "watch on {kind} from the version at hand failed; listing")
            }
        }
    }
    let events = watch_object(api, name).backoff(Reconnect::default());
    let mut events = std::pin::pin!(events);
    let mut failing = false;
    loop {
        let event = tokio::select! {
            _ = shared.stop.cancelled() => return,
            e = events.next() => e,
        };
        match event {
            Some(Ok(object)) => {
                failing = false;
                if seen(object).is_break() {
                    return;
                }
            }
            Some(Err(error)) => {
                if !failing {
                    tracing::warn!(lease = %shared.lease, claim = %shared.claim, error = %report(&error), "watch on {kind} failed; retrying");
                } else {
                    tracing::debug!(lease = %shared.lease, claim = %shared.claim, error = %report(&error), "watch on {kind} failed; retrying");
                }
                failing = true;
            }
            None => return,
        }
    }
}

/// Hands `seed` to `seen`, then each change of object `name` watched from `seed`'s version,
/// until `seen` breaks or the watch ends (`Continue`) or fails.
async fn follow_from<K>(
    api: &Api<K>,
    name: &str,
    seed: K,
    seen: &mut impl FnMut(Option<K>) -> ControlFlow<()>,
) -> Result<ControlFlow<()>, kube::Error>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let version = seed.meta().resource_version.clone().unwrap_or_default();
    if seen(Some(seed)).is_break() {
        return Ok(ControlFlow::Break(()));
    }
    let params = WatchParams::default().fields(&format!("metadata.name={name}"));
    let events = api.watch(&params, &version).await?;
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let flow = match event? {
            WatchEvent::Added(object) | WatchEvent::Modified(object) => seen(Some(object)),
            WatchEvent::Deleted(_) => seen(None),
            WatchEvent::Bookmark(_) => ControlFlow::Continue(()),
            WatchEvent::Error(status) => return Err(kube::Error::Api(status)),
        };
        if flow.is_break() {
            return Ok(flow);
        }
    }
    Ok(ControlFlow::Continue(()))
}

/// How a failed watch comes back: 200 ms doubling to 3 s, between half and all of it by
/// chance, so that many holders do not reconnect in step.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(3), 0.5);

/// [`RECONNECT`] counting the failures since the watch last worked.
#[derive(Debug, Default)]
struct Reconnect {
    failures: u32,
}

impl Iterator for Reconnect {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.failures = self.failures.saturating_add(1);
        Some(RECONNECT.pause(self.failures))
    }
}

impl kube::runtime::utils::Backoff for Reconnect {
    fn reset(&mut self) {
        self.failures = 0;
    }
}
