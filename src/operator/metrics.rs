//! Prometheus metrics of the operator, served on `/metrics`.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    pub namespace: String,
    pub lease: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Transition {
    Granted,
    Expired,
    Released,
    Revoked,
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
    pub transitions: Family<TransitionLabels, Counter>,
    /// Lease status writes refused with 409 Conflict (someone else moved first).
    pub conflicts: Counter,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Histogram,
    /// 1 while the lease has a holder.
    pub holders: Family<LeaseLabels, Gauge>,
    /// Claims waiting for the lease.
    pub waiting: Family<LeaseLabels, Gauge>,
    /// Events put on the publishing queue.
    pub events_queued: Counter,
    /// Events dropped because the publishing queue was full (never waited for).
    pub events_dropped: Counter,
    /// Events the apiserver refused or did not answer in time.
    pub events_failed: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("fenced_lease");
        let transitions = Family::<TransitionLabels, Counter>::default();
        registry.register(
            "transitions",
            "Lease transitions: Granted, Expired, Released, Revoked",
            transitions.clone(),
        );
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
        let holders = Family::<LeaseLabels, Gauge>::default();
        registry.register("holders", "1 while the lease has a holder", holders.clone());
        let waiting = Family::<LeaseLabels, Gauge>::default();
        registry.register(
            "waiting_claims",
            "Claims waiting for the lease",
            waiting.clone(),
        );
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
        Self {
            registry,
            events_queued,
            events_dropped,
            events_failed,
            transitions,
            conflicts,
            reconcile_errors,
            reconcile_duration,
            holders,
            waiting,
        }
    }
}

impl Metrics {
    pub fn transition(&self, namespace: &str, lease: &str, transition: Transition) {
        let labels = TransitionLabels {
            namespace: namespace.into(),
            lease: lease.into(),
            transition,
        };
        self.transitions.get_or_create(&labels).inc();
    }

    pub fn lease_state(&self, namespace: &str, lease: &str, held: bool, waiting: i64) {
        let labels = LeaseLabels {
            namespace: namespace.into(),
            lease: lease.into(),
        };
        self.holders.get_or_create(&labels).set(i64::from(held));
        self.waiting.get_or_create(&labels).set(waiting);
    }

    pub fn forget_lease(&self, namespace: &str, lease: &str) {
        let labels = LeaseLabels {
            namespace: namespace.into(),
            lease: lease.into(),
        };
        self.holders.remove(&labels);
        self.waiting.remove(&labels);
        for transition in [
            Transition::Granted,
            Transition::Expired,
            Transition::Released,
            Transition::Revoked,
        ] {
            self.transitions.remove(&TransitionLabels {
                namespace: namespace.into(),
                lease: lease.into(),
                transition,
            });
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_transitions_per_lease() {
        let m = Metrics::default();
        m.transition("ns", "db", Transition::Granted);
        m.lease_state("ns", "db", true, 2);
        let text = m.encode();
        assert!(text.contains(r#"fenced_lease_transitions_total{namespace="ns",lease="db",transition="Granted"} 1"#), "{text}");
        assert!(
            text.contains(r#"fenced_lease_waiting_claims{namespace="ns",lease="db"} 2"#),
            "{text}"
        );
    }
}
