//! Prometheus metrics of the operator, served on `/metrics`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::api::FencedLease;
pub use crate::operator::core::transitions::Transition;
use crate::operator::names::{joined_name, split_name};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    pub namespace: String,
    pub lease: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub namespace: String,
    pub lease: String,
    pub transition: Transition,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: String,
}

/// All metrics, registered once.
pub struct Metrics {
    pub registry: Registry,
    /// Lease hand-overs, by kind: grants, expiries, releases, revocations.
    pub transitions: TransitionCounts,
    /// Lease status writes refused with 409 Conflict (someone else moved first).
    pub conflicts: Counter,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Histogram,
    /// The per-lease gauges (holder, waiting claims), read from the lease cache at each scrape.
    pub leases: LeaseGauges,
    /// Events put on the publishing queue.
    pub events_queued: Counter,
    /// Events dropped because the publishing queue was full (never waited for).
    pub events_dropped: Counter,
    /// Events the apiserver refused or did not answer in time.
    pub events_failed: Counter,
    /// Normal Events not published: more were due than the budget lets through.
    pub events_skipped: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("fenced_lease");
        let transitions = TransitionCounts::default();
        registry.register_collector(Box::new(transitions.clone()));
        let conflicts = Counter::default();
        registry.register(
            "status_conflicts",
            "Lease status writes refused on resourceVersion (409)",
            conflicts.clone(),
        );
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by error kind",
            reconcile_errors.clone(),
        );
        let reconcile_duration = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            reconcile_duration.clone(),
        );
        let leases = LeaseGauges::default();
        registry.register_collector(Box::new(leases.clone()));
        let events_queued = Counter::default();
        registry.register(
            "events_queued",
            "Kubernetes Events queued for publishing",
            events_queued.clone(),
        );
        let events_dropped = Counter::default();
        registry.register(
            "events_dropped",
            "Kubernetes Events dropped because the publishing queue was full",
            events_dropped.clone(),
        );
        let events_failed = Counter::default();
        registry.register(
            "events_failed",
            "Kubernetes Events the apiserver refused or did not answer in time",
            events_failed.clone(),
        );
        let events_skipped = Counter::default();
        registry.register(
            "events_skipped",
            "Normal Kubernetes Events (grants, releases) not published because more were due than --events-per-second lets through; fenced_lease_transitions_total counts them all",
            events_skipped.clone(),
        );
        Self {
            registry,
            events_skipped,
            events_queued,
            events_dropped,
            events_failed,
            transitions,
            conflicts,
            reconcile_errors,
            reconcile_duration,
            leases,
        }
    }
}

impl Metrics {
    pub fn transition(&self, namespace: &str, lease: &str, transition: Transition) {
        self.transitions.count(namespace, lease, transition);
    }

    pub fn forget_lease(&self, namespace: &str, lease: &str) {
        self.transitions.forget(namespace, lease);
    }

    pub fn error(&self, label: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                error: label.into(),
            })
            .inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

const TRANSITIONS: [Transition; 4] = [
    Transition::Granted,
    Transition::Expired,
    Transition::Released,
    Transition::Revoked,
];

/// `transitions_total` by lease and kind: four counts per lease under one `namespace\0lease`
/// string, about half the memory of a counter family keyed by owned label strings.
#[derive(Clone, Debug, Default)]
pub struct TransitionCounts {
    counts: Arc<Mutex<HashMap<Box<str>, [u64; 4]>>>,
}

impl TransitionCounts {
    fn count(&self, namespace: &str, lease: &str, transition: Transition) {
        let key = joined_name(namespace, lease);
        let mut counts = self.lock();
        let slot = match counts.get_mut(key.as_str()) {
            Some(slot) => slot,
            None => counts.entry(key.into_boxed_str()).or_default(),
        };
        slot[TRANSITIONS
            .iter()
            .position(|t| *t == transition)
            .unwrap_or(0)] += 1;
    }

    fn forget(&self, namespace: &str, lease: &str) {
        self.lock().remove(joined_name(namespace, lease).as_str());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, [u64; 4]>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Collector for TransitionCounts {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts: Vec<(Box<str>, [u64; 4])> =
            self.lock().iter().map(|(k, v)| (k.clone(), *v)).collect();
        let mut family = encoder.encode_descriptor(
            "transitions",
            "Lease transitions: Granted, Expired, Released, Revoked",
            None,
            MetricType::Counter,
        )?;
        for (key, values) in counts {
            let (namespace, lease) = split_name(&key).unwrap_or(("", &key));
            for (transition, value) in TRANSITIONS.into_iter().zip(values) {
                if value == 0 {
                    continue;
                }
                let labels = TransitionLabels {
                    namespace: namespace.into(),
                    lease: lease.into(),
                    transition,
                };
                ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// `holders` and `waiting_claims` of every lease in the operator's cache, read from the
/// leases' statuses when scraped: they cost no memory per lease, and cannot disagree with the
/// cache (nor outlive a lease). Nothing is reported before the cache exists.
#[derive(Clone, Debug, Default)]
pub struct LeaseGauges {
    cache: Arc<RwLock<Option<Store<FencedLease>>>>,
}

impl LeaseGauges {
    /// Reports the leases of `cache` from now on (each run of the controllers has its own).
    pub fn watch(&self, cache: Store<FencedLease>) {
        *self.cache.write().unwrap_or_else(|e| e.into_inner()) = Some(cache);
    }
}

/// One gauge's value, read from a lease.
type Reading = fn(&FencedLease) -> i64;

impl Collector for LeaseGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(cache) = self.cache.read().unwrap_or_else(|e| e.into_inner()).clone() else {
            return Ok(());
        };
        let leases = cache.state();
        let labels = |lease: &FencedLease| LeaseLabels {
            namespace: lease.namespace().unwrap_or_default(),
            lease: lease.name_any(),
        };
        let gauges: [(&str, &str, Reading); 2] = [
            ("holders", "1 while the lease has a holder", |l| {
                l.status
                    .as_ref()
                    .map_or(0, |s| i64::from(s.holder.is_some()))
            }),
            ("waiting_claims", "Claims waiting for the lease", |l| {
                l.status.as_ref().map_or(0, |s| i64::from(s.waiting))
            }),
        ];
        for (name, help, value) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for lease in &leases {
                let labels = labels(lease);
                ConstGauge::new(value(lease)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher;

    #[test]
    fn exposes_transitions_per_lease() {
        let m = Metrics::default();
        m.transition("ns", "db", Transition::Granted);
        m.transition("ns", "db", Transition::Released);
        m.transition("ns", "db", Transition::Granted);
        m.transition("ns", "gone", Transition::Granted);
        m.forget_lease("ns", "gone");
        let (cache, mut writer) = kube::runtime::reflector::store::<FencedLease>();
        let mut lease: FencedLease = serde_json::from_value(serde_json::json!({
            "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
            "metadata": {"name": "db", "namespace": "ns"}, "spec": {}
        }))
        .unwrap();
        lease.status = Some(crate::api::FencedLeaseStatus {
            holder: Some(Default::default()),
            waiting: 2,
            ..Default::default()
        });
        writer.apply_watcher_event(&watcher::Event::Apply(lease));
        m.leases.watch(cache);
        let text = m.encode();
        assert!(text.contains(r#"fenced_lease_transitions_total{namespace="ns",lease="db",transition="Granted"} 2"#), "{text}");
        assert!(text.contains(r#"fenced_lease_transitions_total{namespace="ns",lease="db",transition="Released"} 1"#), "{text}");
        assert!(
            !text.contains(r#"transition="Expired""#),
            "no series of a count of 0: {text}"
        );
        assert!(!text.contains(r#"lease="gone""#), "{text}");
        assert!(
            text.contains("# TYPE fenced_lease_transitions counter"),
            "{text}"
        );
        assert!(
            text.contains(r#"fenced_lease_waiting_claims{namespace="ns",lease="db"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"fenced_lease_holders{namespace="ns",lease="db"} 1"#),
            "{text}"
        );
    }
}
