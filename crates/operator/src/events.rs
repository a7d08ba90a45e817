//! Kubernetes Events, published off the reconcile path: reconciles put them on a bounded
//! queue and go on; one task drains it a few at a time. A full queue drops the Event and
//! counts it (`fenced_lease_events_dropped_total`) rather than hold up a grant: Events are a
//! report, the lease and claim statuses are the record.
//!
//! Normal Events have a budget: a burst of [`BURST_SECONDS`] worth, then a steady rate (the
//! operator's `--events-per-second`), so that a burst of grants does not spend the apiserver's
//! writes on a report. Those over the budget are counted (`fenced_lease_events_skipped_total`),
//! and every transition still is (`fenced_lease_transitions_total`). Warnings are never
//! budgeted.
//!
//! Warnings go through kube's [`Recorder`], which folds a repeated warning into one Event
//! series with a count. Normal Events (grants, releases, expiries) are one per transition
//! and are created directly: the Recorder keeps every Event it published in the last six
//! minutes and scans them all on each publish: memory and a scan per grant that grow with the
//! grant rate.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error::truncate;
use crate::metrics::Metrics;
use crate::state::locked;

/// Events waiting to be published; beyond this they are dropped.
pub const QUEUE: usize = 1024;
/// Events being published at once (each is one apiserver write).
const IN_FLIGHT: usize = 4;

/// The budget of Normal Events starts full with this many seconds' worth.
pub const BURST_SECONDS: f64 = 10.0;

/// The sending side of the Event queue (cheap to clone).
#[derive(Clone)]
pub struct Events {
    tx: mpsc::Sender<(Event, ObjectReference)>,
    metrics: Arc<Metrics>,
    normal: Arc<Mutex<Budget>>,
}

/// A token bucket: `rate` a second, at most `burst` saved up.
#[derive(Debug)]
pub struct Budget {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Budget {
    /// `rate` a second after a burst of [`BURST_SECONDS`] worth (at least one).
    pub fn new(rate: f64, now: Instant) -> Self {
        let rate = rate.max(0.0);
        let burst = if rate > 0.0 {
            (rate * BURST_SECONDS).max(1.0)
        } else {
            0.0
        };
        Self {
            rate,
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Takes one, if there is one at `now`.
    pub fn take(&mut self, now: Instant) -> bool {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + earned).min(self.burst);
        self.at = now.max(self.at);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl Events {
    /// Starts the task that publishes queued Events with `recorder`, each within `timeout`,
    /// until `stop` (Events still queued then are dropped); Normal ones at most
    /// `normal_per_second` (after a burst).
    pub fn start(
        client: kube::Client,
        reporter: Reporter,
        metrics: Arc<Metrics>,
        timeout: Duration,
        normal_per_second: f64,
        stop: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let publisher = Publisher {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
        };
        tokio::spawn(drain(publisher, metrics.clone(), rx, timeout, stop));
        let normal = Arc::new(Mutex::new(Budget::new(normal_per_second, Instant::now())));
        Self {
            tx,
            metrics,
            normal,
        }
    }

    /// Queues an Event for publishing; never waits, and a failure is never fatal.
    pub fn event(
        &self,
        on: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.event_about(on, None, type_, reason, action, note);
    }

    /// Queues an Event about `on` that concerns `related` too (a lease's claim). Events of
    /// the same reason about different claims stay distinct instead of being folded into one
    /// series, so every grant keeps its own note (and token). Never waits: a full queue drops
    /// the Event (counted and logged).
    pub fn event_about(
        &self,
        on: &ObjectReference,
        related: Option<ObjectReference>,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate(&note, 1024).to_string()),
            action: action.into(),
            secondary: related,
        };
        if event.type_ == EventType::Normal {
            let mut normal = locked(&self.normal);
            if !normal.take(Instant::now()) {
                self.metrics.events_skipped.inc();
                return;
            }
        }
        match self.tx.try_send((event, on.clone())) {
            Ok(()) => {
                self.metrics.events_queued.inc();
            }
            Err(mpsc::error::TrySendError::Full((event, _))) => {
                self.metrics.events_dropped.inc();
                tracing::debug!(reason = %event.reason, name = ?on.name, "Event queue full; Event dropped");
            }
            // The publisher stopped: the operator is shutting down.
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.metrics.events_dropped.inc();
            }
        }
    }
}

#[cfg(test)]
impl Events {
    /// Events queued and never published, for tests: the receiver shows them.
    pub(crate) fn unpublished(
        metrics: Arc<Metrics>,
    ) -> (Self, mpsc::Receiver<(Event, ObjectReference)>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let normal = Arc::new(Mutex::new(Budget::new(1000.0, Instant::now())));
        let events = Self {
            tx,
            metrics,
            normal,
        };
        (events, rx)
    }
}

/// Publishes one Event: Warnings through the Recorder (series), Normal ones created directly.
#[derive(Clone)]
struct Publisher {
    client: kube::Client,
    reporter: Reporter,
    recorder: Recorder,
}

impl Publisher {
    async fn publish(&self, event: &Event, on: &ObjectReference) -> Result<(), kube::Error> {
        if event.type_ == EventType::Warning {
            return self.recorder.publish(event, on).await;
        }
        let ns = on.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), ns);
        api.create(&PostParams::default(), &self.normal(event, on))
            .await
            .map(drop)
    }

    /// The Event object, as the Recorder would write its first occurrence.
    fn normal(&self, event: &Event, on: &ObjectReference) -> K8sEvent {
        let now = Timestamp::now();
        let controller = &self.reporter.controller;
        K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(on.clone()),
            related: event.secondary.clone(),
            note: event.note.clone(),
            metadata: ObjectMeta {
                namespace: on.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    on.name.as_deref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some("Normal".into()),
            ..Default::default()
        }
    }
}

async fn drain(
    publisher: Publisher,
    metrics: Arc<Metrics>,
    rx: mpsc::Receiver<(Event, ObjectReference)>,
    timeout: Duration,
    stop: CancellationToken,
) {
    let queued = futures::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        Some((item, rx))
    });
    queued
        .take_until(stop.cancelled_owned())
        .map(|(event, on)| {
            let (publisher, metrics) = (publisher.clone(), metrics.clone());
            async move {
                match tokio::time::timeout(timeout, publisher.publish(&event, &on)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        metrics.events_failed.inc();
                        tracing::warn!(reason = %event.reason, error = %e, "cannot publish Event");
                    }
                    Err(_) => {
                        metrics.events_failed.inc();
                        tracing::warn!(reason = %event.reason, "publishing an Event timed out");
                    }
                }
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .for_each(|()| futures::future::ready(()))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_events_pass_a_burst_then_the_steady_rate() {
        let t0 = Instant::now();
        let mut b = Budget::new(5.0, t0);
        let burst = (0..100).filter(|_| b.take(t0)).count();
        assert_eq!(burst, 50, "ten seconds' worth at once");
        // One second later: five more, not fifty.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!((0..100).filter(|_| b.take(t1)).count(), 5);
        // Idle for a minute: the burst again, no more.
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!((0..100).filter(|_| b.take(t2)).count(), 50);
        // Zero: none.
        let mut none = Budget::new(0.0, t0);
        assert!(!none.take(t0 + Duration::from_secs(10)));
    }
}
