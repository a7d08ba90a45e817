//! What a holder does with a refusal of its write ([`LeaseHandle::refusal`]): an error log
//! line, a count in the counter of [`register_metrics`], and a Warning Event `WriteRefused` on
//! the FencedLease from the refused pod, which the operator counts per lease for the critical
//! alert (docs/runbooks.md), so that a program exporting no metrics is seen too.
//!
//! A wedged holder retrying in a loop must not flood the apiserver: the first refusal is sent
//! at once, the later ones at most one call per lease per [`INTERVAL`], into the same Event,
//! whose `series.count` is the number of refusals and whose note is the last one's.
//! (kube-runtime's `Recorder` counts calls, not occurrences, and keeps the first note.)
//!
//! [`LeaseHandle::refusal`]: super::LeaseHandle::refusal

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, timeout};

use super::error::report;
use crate::api::{FencedLease, HOLDER_REPORTING_CONTROLLER, WRITE_REFUSED_REASON};

/// At most one Event call per lease per interval, after the first refusal's.
pub const INTERVAL: Duration = Duration::from_secs(10);
/// `reportingInstance` is at most this long (the Events API's bound).
const MAX_INSTANCE: usize = 128;
/// A note is at most this long (the Events API's bound: 1 kB).
const MAX_NOTE: usize = 1024;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    namespace: String,
    lease: String,
}

/// This process's refusals, by lease: one series per lease, never per token or pod.
static REFUSALS: LazyLock<Family<LeaseLabels, Counter>> = LazyLock::new(Family::default);

/// Registers `fenced_lease_holder_write_refusals_total` (by `namespace` and `lease`) in the
/// program's registry: the writes of this process a fence or guard refused.
pub fn register_metrics(registry: &mut Registry) {
    registry.register(
        "fenced_lease_holder_write_refusals",
        "Writes of this program that a fence or guard refused for a stale token, by lease",
        REFUSALS.clone(),
    );
}

/// The reference of FencedLease `namespace/lease`, as the Events name it.
pub fn lease_reference(namespace: &str, lease: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(FencedLease::api_version(&()).into()),
        kind: Some(FencedLease::kind(&()).into()),
        namespace: Some(namespace.into()),
        name: Some(lease.into()),
        ..Default::default()
    }
}

/// The Warning Event of `refused` refusals of a lease's writes by `instance` (a pod name, or
/// a username outside pods), the last one described by `note`.
pub fn refusal_event(lease: &ObjectReference, instance: &str, refused: u64, note: &str) -> Event {
    let now = MicroTime(Timestamp::now());
    let namespace = lease.namespace.clone();
    let name = lease.name.as_deref().unwrap_or("lease");
    Event {
        metadata: ObjectMeta {
            name: Some(format!(
                "{name}.{:x}",
                Timestamp::now().as_nanosecond().unsigned_abs()
            )),
            namespace,
            ..Default::default()
        },
        event_time: Some(now.clone()),
        type_: Some("Warning".into()),
        reason: Some(WRITE_REFUSED_REASON.into()),
        action: Some("Write".into()),
        note: Some(truncate(note, MAX_NOTE)),
        regarding: Some(lease.clone()),
        reporting_controller: Some(HOLDER_REPORTING_CONTROLLER.into()),
        reporting_instance: Some(truncate(instance, MAX_INSTANCE)),
        series: (refused > 1).then(|| EventSeries {
            count: i32::try_from(refused).unwrap_or(i32::MAX),
            last_observed_time: now,
        }),
        ..Default::default()
    }
}

/// The patch that brings an Event of refusals to `refused`, the last described by `note`.
fn series_patch(refused: u64, note: &str) -> serde_json::Value {
    serde_json::json!({
        "note": truncate(note, MAX_NOTE),
        "series": {
            "count": i32::try_from(refused).unwrap_or(i32::MAX),
            "lastObservedTime": MicroTime(Timestamp::now()),
        },
    })
}

fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// The Events of one claim's refusals: sends them paced (see the module's documentation).
pub(crate) struct Reporter {
    /// `None`: count and log only (unit tests).
    events: Option<Api<Event>>,
    /// This lease's series of the counter.
    counted: Counter,
    lease: ObjectReference,
    instance: String,
    call_timeout: Duration,
    state: Mutex<State>,
    /// Cuts the pause before a call short (a flush).
    flush: Notify,
    /// Refusals sent (or given up on) so far.
    sent: watch::Sender<u64>,
    /// Calls made (or, without a client, that would have been).
    calls: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct State {
    refused: u64,
    note: String,
    /// A task is sending (or pausing before a send).
    sending: bool,
    /// The Event of this claim's refusals, once created.
    event: Option<String>,
    /// When the last call was made.
    last_sent: Option<Instant>,
}

impl Reporter {
    pub fn new(
        client: Option<Client>,
        namespace: &str,
        lease: &str,
        instance: &str,
        call_timeout: Duration,
    ) -> Arc<Reporter> {
        Arc::new(Reporter {
            events: client.map(|c| Api::namespaced(c, namespace)),
            counted: REFUSALS
                .get_or_create(&LeaseLabels {
                    namespace: namespace.into(),
                    lease: lease.into(),
                })
                .clone(),
            lease: lease_reference(namespace, lease),
            instance: instance.into(),
            call_timeout,
            state: Mutex::default(),
            flush: Notify::new(),
            sent: watch::channel(0).0,
            calls: Default::default(),
        })
    }

    /// Counts one refusal described by `note`; sends it now or at the end of the pause.
    pub fn record(self: &Arc<Self>, note: String) {
        self.counted.inc();
        let start = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.refused += 1;
            state.note = note;
            !std::mem::replace(&mut state.sending, true)
        };
        if !start {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(self.clone().send_paced());
            }
            Err(_) => {
                tracing::warn!(lease = ?self.lease.name, "no Tokio runtime: the refusal is not reported as an Event");
                self.state.lock().unwrap_or_else(|e| e.into_inner()).sending = false;
            }
        }
    }

    /// Sends what was recorded so far now, and waits until it is sent (at most two calls).
    pub async fn flush(&self) {
        let target = self.state.lock().unwrap_or_else(|e| e.into_inner()).refused;
        if *self.sent.borrow() >= target {
            return;
        }
        self.flush.notify_one();
        let mut sent = self.sent.subscribe();
        let _ = timeout(self.call_timeout * 2, sent.wait_for(|s| *s >= target)).await;
    }

    /// Sends what was recorded, at most one call per [`INTERVAL`] (a flush does not wait), and
    /// returns as soon as nothing is left to send: no task outlives the reports.
    async fn send_paced(self: Arc<Self>) {
        loop {
            let pause = {
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if state.refused == *self.sent.borrow() {
                    state.sending = false;
                    return;
                }
                state
                    .last_sent
                    .map(|at| (at + INTERVAL).saturating_duration_since(Instant::now()))
            };
            if let Some(pause) = pause.filter(|p| !p.is_zero()) {
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = self.flush.notified() => {}
                }
            }
            let (refused, note, event) = {
                let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                (state.refused, state.note.clone(), state.event.clone())
            };
            let created = self.send(refused, &note, event).await;
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if created.is_some() {
                state.event = created;
            }
            state.last_sent = Some(Instant::now());
            self.sent.send_replace(refused);
        }
    }

    /// One call: a new Event, or the series of the existing one (created again if it has
    /// expired). A failure is logged and not retried: the next refusal tries again.
    async fn send(&self, refused: u64, note: &str, event: Option<String>) -> Option<String> {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let api = self.events.as_ref()?;
        if let Some(name) = event {
            let (params, patch) = (
                PatchParams::default(),
                Patch::Merge(series_patch(refused, note)),
            );
            let call = api.patch(&name, &params, &patch);
            match timeout(self.call_timeout, call).await {
                Ok(Ok(_)) => return Some(name),
                Ok(Err(kube::Error::Api(s))) if s.code == 404 => {}
                outcome => {
                    self.failed(outcome.map(|r| r.map(|_| ())));
                    return Some(name);
                }
            }
        }
        let event = refusal_event(&self.lease, &self.instance, refused, note);
        let params = PostParams::default();
        let call = api.create(&params, &event);
        match timeout(self.call_timeout, call).await {
            Ok(Ok(created)) => created.metadata.name,
            outcome => {
                self.failed(outcome.map(|r| r.map(|_| ())));
                None
            }
        }
    }

    fn failed(&self, outcome: Result<Result<(), kube::Error>, tokio::time::error::Elapsed>) {
        let error = match outcome {
            Ok(Err(e)) => report(&e),
            _ => "no answer".into(),
        };
        tracing::warn!(lease = ?self.lease.name, %error, "could not report the refusal as an Event (needs create and patch on events.k8s.io events: the holder role)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_names_the_lease_the_reporter_and_the_count() {
        let lease = lease_reference("shop", "payouts");
        let event = refusal_event(&lease, &"p".repeat(200), 3, "fenced out");
        assert_eq!(event.reason.as_deref(), Some(WRITE_REFUSED_REASON));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(
            event.regarding.as_ref().unwrap().kind.as_deref(),
            Some("FencedLease")
        );
        assert_eq!(event.reporting_instance.unwrap().len(), MAX_INSTANCE);
        assert_eq!(event.series.unwrap().count, 3);
        assert!(refusal_event(&lease, "p", 1, "x").series.is_none());
        assert!(event.metadata.name.unwrap().starts_with("payouts."));
    }

    /// A wedged holder refused in a loop: the first refusal is sent at once, then one call per
    /// 10 s however many come, and a flush sends the rest without waiting.
    #[tokio::test(start_paused = true)]
    async fn a_flood_of_refusals_costs_one_call_per_interval() {
        let reporter = Reporter::new(None, "shop", "payouts", "pa", Duration::from_secs(5));
        let calls = || reporter.calls.load(std::sync::atomic::Ordering::Relaxed);
        let sent = || *reporter.sent.borrow();
        for i in 0..1000 {
            reporter.record(format!("refusal {i}"));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            (calls(), sent()),
            (1, 1000),
            "the first call at once, with all there are"
        );
        for i in 0..1000 {
            reporter.record(format!("refusal {i}"));
            tokio::time::sleep(Duration::from_millis(9)).await;
        }
        // 9 s of refusals after the first call: none sent yet.
        assert_eq!(calls(), 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            (calls(), sent()),
            (2, 2000),
            "the rest, 10 s after the first"
        );
        reporter.record("one more".into());
        reporter.flush().await;
        assert_eq!((calls(), sent()), (3, 2001), "a flush does not wait");
        assert_eq!(reporter.counted.get(), 2001, "each refusal counted");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(calls(), 3, "nothing more without a refusal");
    }

    #[test]
    fn a_long_note_is_cut_on_a_character() {
        let note = "é".repeat(600);
        let cut = truncate(&note, MAX_NOTE);
        assert_eq!(cut.len(), MAX_NOTE);
        assert!(truncate("short", MAX_NOTE) == "short");
    }
}
