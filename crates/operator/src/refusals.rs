//! The refusals holders report: every replica watches the Warning Events `WriteRefused` on
//! FencedLeases in the served namespaces (sent by the holder libraries, `holder::refusals`) and
//! counts them per lease in `fenced_lease_write_refusals_reported_total`, which the critical
//! alert FencedLeaseWriteRefused reads beside the apiserver's own denials. A PostgreSQL or
//! Redis guard's refusal reaches Prometheus this way, and so does a fenced Kubernetes write
//! where the apiserver's metrics are not scraped (a managed control plane).
//!
//! An Event counts its refusals in `series.count`; what this process adds to a lease's
//! counter is what each Event's count grew by since it was first seen. An Event first seen
//! already observed before this process started is history: its count is the baseline, so a
//! restart does not replay old refusals ([`Tally`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::metrics::Metrics;
use fenced_lease_api::WRITE_REFUSED_REASON as REASON;

/// What each watched Event adds to its lease's count of reported refusals.
#[derive(Debug)]
pub struct Tally {
    /// This process's start: an Event first seen and last observed before it is history.
    start: Timestamp,
    /// Refusals counted (or taken as the baseline) of each Event, by UID.
    seen: HashMap<String, u64>,
    /// The UIDs of the list under way, if one is.
    listing: Option<HashSet<String>>,
}

/// One Event of refusals as the tally reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub uid: String,
    pub namespace: String,
    pub lease: String,
    /// Refusals the Event counts: `series.count`, or 1 for an Event without a series.
    pub count: u64,
    /// When its last refusal was observed, as its reporter says.
    pub last_observed: Option<Timestamp>,
}

impl Report {
    /// `event` read as a report, or `None` when it is no refusal of a FencedLease's write.
    pub fn of(event: &Event) -> Option<Report> {
        let regarding = event.regarding.as_ref()?;
        if event.reason.as_deref() != Some(REASON)
            || regarding.kind.as_deref() != Some("FencedLease")
        {
            return None;
        }
        let series = event.series.as_ref();
        let count = series.map_or(1, |s| u64::try_from(s.count).unwrap_or(1).max(1));
        let last_observed = series
            .map(|s| s.last_observed_time.0)
            .or_else(|| event.event_time.as_ref().map(|t| t.0))
            .or_else(|| event.deprecated_last_timestamp.as_ref().map(|t| t.0))
            .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0));
        Some(Report {
            uid: event.metadata.uid.clone()?,
            namespace: regarding
                .namespace
                .clone()
                .or_else(|| event.metadata.namespace.clone())?,
            lease: regarding.name.clone()?,
            count,
            last_observed,
        })
    }
}

impl Tally {
    pub fn new(start: Timestamp) -> Self {
        Tally {
            start,
            seen: HashMap::new(),
            listing: None,
        }
    }

    /// A (re)list begins: the Events it does not list are gone.
    pub fn list_started(&mut self) {
        self.listing = Some(HashSet::new());
    }

    /// The (re)list has ended: forgets the Events it did not list.
    pub fn list_done(&mut self) {
        if let Some(listed) = self.listing.take() {
            self.seen.retain(|uid, _| listed.contains(uid));
        }
    }

    /// How many new refusals `report` tells of.
    pub fn observe(&mut self, report: &Report) -> u64 {
        if let Some(listed) = &mut self.listing {
            listed.insert(report.uid.clone());
        }
        let before = match self.seen.get(&report.uid) {
            Some(before) => *before,
            None if report.last_observed.is_some_and(|t| t < self.start) => report.count,
            None => 0,
        };
        let now = before.max(report.count);
        self.seen.insert(report.uid.clone(), now);
        now - before
    }

    /// The Event is deleted (its time to live has passed).
    pub fn forget(&mut self, uid: &str) {
        self.seen.remove(uid);
    }

    /// Events tracked.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// Counts the reported refusals of `namespaces` (all when empty) until `stop`: one watch per
/// namespace, each with its own tally.
pub fn start(
    client: &Client,
    namespaces: &[String],
    metrics: Arc<Metrics>,
    stop: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let start = Timestamp::now();
    let apis: Vec<Api<Event>> = if namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        let ns = namespaces.iter();
        ns.map(|n| Api::namespaced(client.clone(), n)).collect()
    };
    apis.into_iter()
        .map(|api| tokio::spawn(count(api, start, metrics.clone(), stop.clone())))
        .collect()
}

async fn count(api: Api<Event>, start: Timestamp, metrics: Arc<Metrics>, stop: CancellationToken) {
    let config = watcher::Config::default()
        .fields(&format!("reason={REASON},regarding.kind=FencedLease"))
        .timeout(290);
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut tally = Tally::new(start);
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            event = events.next() => event,
        };
        match event {
            None => return,
            Some(Err(error)) => {
                warn!(%error, "watch of the refusal Events failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some(Ok(watcher::Event::Init)) => tally.list_started(),
            Some(Ok(watcher::Event::InitDone)) => tally.list_done(),
            Some(Ok(watcher::Event::InitApply(e) | watcher::Event::Apply(e))) => {
                let Some(report) = Report::of(&e) else {
                    continue;
                };
                let new = tally.observe(&report);
                if new > 0 {
                    metrics.refusals_reported(&report.namespace, &report.lease, new);
                    info!(namespace = %report.namespace, lease = %report.lease, new, by = ?e.reporting_instance, note = ?e.note, "a holder reported refused writes");
                }
            }
            Some(Ok(watcher::Event::Delete(e))) => {
                if let Some(uid) = &e.metadata.uid {
                    tally.forget(uid);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(uid: &str, count: u64, at: Timestamp) -> Report {
        Report {
            uid: uid.into(),
            namespace: "shop".into(),
            lease: "payouts".into(),
            count,
            last_observed: Some(at),
        }
    }

    #[test]
    fn an_events_growth_is_counted_once_and_history_is_the_baseline() {
        let start = Timestamp::now();
        let before = start - Duration::from_secs(60);
        let after = start + Duration::from_secs(1);
        let mut tally = Tally::new(start);
        // Observed before this process started: a restart does not replay it.
        assert_eq!(tally.observe(&report("old", 5, before)), 0);
        // ...but what it counts after is new.
        assert_eq!(tally.observe(&report("old", 7, after)), 2);
        // A new Event counts all its refusals; seen again unchanged (a relist), none.
        assert_eq!(tally.observe(&report("new", 1, after)), 1);
        assert_eq!(tally.observe(&report("new", 1, after)), 0);
        assert_eq!(tally.observe(&report("new", 4, after)), 3);
        // A count that goes back (an older copy) adds nothing.
        assert_eq!(tally.observe(&report("new", 2, after)), 0);
        assert_eq!(tally.observe(&report("new", 5, after)), 1);
    }

    #[test]
    fn a_relist_forgets_the_events_it_no_longer_lists() {
        let start = Timestamp::now();
        let after = start + Duration::from_secs(1);
        let mut tally = Tally::new(start);
        tally.observe(&report("a", 1, after));
        tally.observe(&report("b", 1, after));
        tally.list_started();
        assert_eq!(tally.observe(&report("b", 2, after)), 1);
        tally.list_done();
        assert_eq!(tally.len(), 1);
        tally.forget("b");
        assert!(tally.is_empty());
    }

    #[test]
    fn only_refusals_of_a_fenced_lease_are_reports() {
        let mut event: Event = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "payouts.1", "namespace": "shop", "uid": "u1"},
            "eventTime": "2026-12-07T10:00:00.000000Z",
            "reason": "WriteRefused", "type": "Warning", "action": "Write",
            "regarding": {"apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease", "namespace": "shop", "name": "payouts"},
            "reportingController": "fencing.dev/holder", "reportingInstance": "pa",
            "series": {"count": 3, "lastObservedTime": "2026-12-07T10:00:05.000000Z"},
        }))
        .unwrap();
        let read = Report::of(&event).expect("a report");
        assert_eq!((read.lease.as_str(), read.count), ("payouts", 3));
        event.reason = Some("Granted".into());
        assert_eq!(Report::of(&event), None);
    }
}
