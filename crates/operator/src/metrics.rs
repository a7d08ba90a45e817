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
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub use crate::core::transitions::Transition;
use crate::names::LeaseKey;
use crate::state::{Cache, CachedClaim, locked};
use fenced_lease_api::{ClaimPhase, FencedLease};

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
    /// How long after a silent holder's deadline its expiry was made final (I3's epsilon, the
    /// operator's part of it: the hand-over's grant is one lease status write more).
    pub expiry_delay: Histogram,
    /// The per-lease gauges (holder, waiting claims, ...), read from the caches at each scrape.
    pub leases: LeaseGauges,
    /// 1 while this replica leads (reconciles), 0 on a standby.
    pub leader: Gauge,
    /// Events put on the publishing queue.
    pub events_queued: Counter,
    /// Events dropped because the publishing queue was full (never waited for).
    pub events_dropped: Counter,
    /// Events the apiserver refused or did not answer in time.
    pub events_failed: Counter,
    /// Normal Events not published: more were due than the budget lets through.
    pub events_skipped: Counter,
    /// Refused writes the holders reported (their `WriteRefused` Events), by lease.
    pub write_refusals_reported: Family<LeaseLabels, Counter>,
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
        let expiry_delay = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register(
            "expiry_delay_seconds",
            "How long after a silent holder's deadline (its term, counted from when the operator saw its last heartbeat) its expiry was made final on the claim",
            expiry_delay.clone(),
        );
        let leases = LeaseGauges::default();
        registry.register_collector(Box::new(leases.clone()));
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 on the replica that leads (reconciles leases), 0 on a standby",
            leader.clone(),
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
        let events_skipped = Counter::default();
        registry.register(
            "events_skipped",
            "Normal Kubernetes Events (grants, releases) not published because more were due than --events-per-second lets through; fenced_lease_transitions_total counts them all",
            events_skipped.clone(),
        );
        let write_refusals_reported = Family::<LeaseLabels, Counter>::default();
        registry.register(
            "write_refusals_reported",
            "Writes refused by a fence or guard for a stale token, as the refused holders reported them (WriteRefused Events on the FencedLease), by lease",
            write_refusals_reported.clone(),
        );
        Self {
            registry,
            write_refusals_reported,
            events_skipped,
            events_queued,
            events_dropped,
            events_failed,
            transitions,
            conflicts,
            reconcile_errors,
            reconcile_duration,
            expiry_delay,
            leases,
            leader,
        }
    }
}

impl Metrics {
    pub fn error(&self, label: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                error: label.into(),
            })
            .inc();
    }

    /// Counts `new` refusals reported of lease `namespace/lease`.
    pub fn refusals_reported(&self, namespace: &str, lease: &str, new: u64) {
        let labels = LeaseLabels {
            namespace: namespace.into(),
            lease: lease.into(),
        };
        self.write_refusals_reported
            .get_or_create(&labels)
            .inc_by(new);
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

/// `transitions_total` by lease and kind: four counts per lease under its key, not a counter
/// family keyed by owned label strings.
#[derive(Clone, Debug, Default)]
pub struct TransitionCounts {
    counts: Arc<Mutex<HashMap<LeaseKey, [u64; 4]>>>,
}

impl TransitionCounts {
    /// Counts one `transition` of lease `namespace/lease`.
    pub fn count(&self, namespace: &str, lease: &str, transition: Transition) {
        let mut counts = locked(&self.counts);
        let slot = counts.entry(LeaseKey::new(namespace, lease)).or_default();
        slot[TRANSITIONS
            .iter()
            .position(|t| *t == transition)
            .unwrap_or(0)] += 1;
    }

    /// Forgets lease `namespace/lease` (deleted): its series go.
    pub fn forget(&self, namespace: &str, lease: &str) {
        locked(&self.counts).remove(&LeaseKey::new(namespace, lease));
    }
}

impl Collector for TransitionCounts {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts: Vec<(LeaseKey, [u64; 4])> = locked(&self.counts)
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        let mut family = encoder.encode_descriptor(
            "transitions",
            "Lease transitions: Granted, Expired, Released, Revoked",
            None,
            MetricType::Counter,
        )?;
        for (key, values) in counts {
            let (namespace, lease) = (key.namespace(), key.name());
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

/// The per-lease gauges of every lease in the operator's cache (`holders`, `waiting_claims`,
/// `degraded`, `lease_duration_seconds`, `oldest_waiting_claim_created_seconds`), read from
/// the lease and claim caches when scraped: they cost no memory per lease, and cannot disagree
/// with the caches (nor outlive a lease). Nothing is reported before the caches exist.
#[derive(Clone, Default)]
pub struct LeaseGauges {
    caches: Arc<RwLock<Option<Caches>>>,
}

/// The caches the per-lease gauges are read from.
type Caches = (Store<FencedLease>, Cache<CachedClaim>);

impl std::fmt::Debug for LeaseGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGauges").finish_non_exhaustive()
    }
}

impl LeaseGauges {
    /// Reports the leases of `leases`, and the waiting claims of `claims`, from now on (each
    /// run of the controllers has its own caches).
    pub fn watch(&self, leases: Store<FencedLease>, claims: Cache<CachedClaim>) {
        *self.caches.write().unwrap_or_else(|e| e.into_inner()) = Some((leases, claims));
    }
}

/// One gauge's value, read from a lease.
type Reading = fn(&FencedLease) -> i64;

/// Is this claim waiting for its lease (not holding, not done, not being deleted)?
fn is_waiting(claim: &CachedClaim) -> bool {
    claim.metadata.deletion_timestamp.is_none()
        && matches!(
            claim.status.as_ref().and_then(|s| s.phase),
            None | Some(ClaimPhase::Pending)
        )
}

/// Per lease, the creation time in Unix seconds of its oldest waiting
/// claim: one pass over the claims.
fn oldest_waiting(claims: &[Arc<CachedClaim>]) -> HashMap<LeaseKey, i64> {
    let mut oldest: HashMap<LeaseKey, i64> = HashMap::new();
    for claim in claims.iter().filter(|c| is_waiting(c)) {
        let Some(created) = &claim.metadata.creation_timestamp else {
            continue;
        };
        let key = LeaseKey::new(
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            &claim.spec.lease_name,
        );
        let created = created.0.as_second();
        oldest
            .entry(key)
            .and_modify(|t| *t = (*t).min(created))
            .or_insert(created);
    }
    oldest
}

impl Collector for LeaseGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some((cache, claims)) = self
            .caches
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        else {
            return Ok(());
        };
        let leases = cache.state();
        let labels = |lease: &FencedLease| LeaseLabels {
            namespace: lease.namespace().unwrap_or_default(),
            lease: lease.name_any(),
        };
        let gauges: [(&str, &str, Reading); 4] = [
            ("holders", "1 while the lease has a holder", |l| {
                l.status
                    .as_ref()
                    .map_or(0, |s| i64::from(s.holder.is_some()))
            }),
            ("waiting_claims", "Claims waiting for the lease", |l| {
                l.status.as_ref().map_or(0, |s| i64::from(s.waiting))
            }),
            (
                "degraded",
                "1 while the lease's condition Degraded is True: no token can be issued (an unreadable token record, say), so grants have stopped",
                |l| {
                    l.status.as_ref().map_or(0, |s| {
                        i64::from(
                            s.conditions
                                .iter()
                                .any(|c| c.type_ == "Degraded" && c.status == "True"),
                        )
                    })
                },
            ),
            (
                "lease_duration_seconds",
                "The lease's duration: the running term's, else spec.leaseDurationSeconds",
                |l| i64::from(l.term_seconds()),
            ),
        ];
        for (name, help, value) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for lease in &leases {
                let labels = labels(lease);
                ConstGauge::new(value(lease)).encode(family.encode_family(&labels)?)?;
            }
        }
        let oldest = oldest_waiting(&claims.state());
        let mut family = encoder.encode_descriptor(
            "oldest_waiting_claim_created_seconds",
            "Creation time (Unix seconds) of the lease's oldest waiting claim; no series while none waits",
            None,
            MetricType::Gauge,
        )?;
        for lease in &leases {
            let labels = labels(lease);
            if let Some(created) = oldest.get(&LeaseKey::new(&labels.namespace, &labels.lease)) {
                ConstGauge::new(*created).encode(family.encode_family(&labels)?)?;
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
        m.transitions.count("ns", "db", Transition::Granted);
        m.transitions.count("ns", "db", Transition::Released);
        m.transitions.count("ns", "db", Transition::Granted);
        m.transitions.count("ns", "gone", Transition::Granted);
        m.transitions.forget("ns", "gone");
        let (cache, mut writer) = kube::runtime::reflector::store::<FencedLease>();
        let mut lease = lease("db", serde_json::json!({}));
        lease.status = Some(fenced_lease_api::FencedLeaseStatus {
            holder: Some(Default::default()),
            waiting: 2,
            ..Default::default()
        });
        writer.apply_watcher_event(&watcher::Event::Apply(lease));
        m.leases.watch(cache, Cache::new().0);
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

    fn lease(name: &str, spec: serde_json::Value) -> FencedLease {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
            "metadata": {"name": name, "namespace": "ns"}, "spec": spec
        }))
        .unwrap()
    }

    fn claim(name: &str, lease: &str, created: &str, phase: Option<&str>) -> CachedClaim {
        let mut claim = serde_json::json!({
            "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
            "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
            "spec": {"leaseName": lease, "holderIdentity": name}
        });
        if let Some(phase) = phase {
            claim["status"] = serde_json::json!({"phase": phase});
        }
        CachedClaim::from(
            serde_json::from_value::<fenced_lease_api::FencedLeaseClaim>(claim).unwrap(),
        )
    }

    #[test]
    fn exposes_degraded_leases_durations_and_the_oldest_waiting_claim() {
        let m = Metrics::default();
        let (leases, mut lease_writer) = kube::runtime::reflector::store::<FencedLease>();
        let mut stuck = lease("stuck", serde_json::json!({"leaseDurationSeconds": 30}));
        stuck.status = Some(fenced_lease_api::FencedLeaseStatus {
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: "Degraded".into(),
                status: "True".into(),
                reason: "TokenRecordUnreadable".into(),
                message: "unreadable".into(),
                observed_generation: None,
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
            }],
            ..Default::default()
        });
        let mut held = lease("held", serde_json::json!({"leaseDurationSeconds": 30}));
        // The running term's duration wins over the spec's (changed since the grant).
        held.status = Some(fenced_lease_api::FencedLeaseStatus {
            holder: Some(Default::default()),
            lease_duration_seconds: Some(10),
            ..Default::default()
        });
        for l in [stuck, held, lease("idle", serde_json::json!({}))] {
            lease_writer.apply_watcher_event(&watcher::Event::Apply(l));
        }
        let (claims, mut claim_writer) = Cache::<CachedClaim>::new();
        let mut deleting = claim("d", "held", "2026-01-01T00:00:00Z", None);
        deleting.metadata.deletion_timestamp = deleting.metadata.creation_timestamp.clone();
        for c in [
            claim("holder", "held", "2026-01-01T00:00:01Z", Some("Granted")),
            claim("late", "held", "2026-01-01T00:01:40Z", Some("Pending")),
            claim("early", "held", "2026-01-01T00:00:10Z", None),
            claim("gone", "held", "2026-01-01T00:00:02Z", Some("Expired")),
            deleting,
            claim("w", "stuck", "2026-01-01T00:00:20Z", Some("Pending")),
            claim("orphan", "missing", "2026-01-01T00:00:05Z", None),
        ] {
            claim_writer.apply(&watcher::Event::Apply(c));
        }
        m.leases.watch(leases, claims);
        m.leader.set(1);
        let text = m.encode();
        let has = |line: &str| assert!(text.contains(line), "{line} missing from:\n{text}");
        has(r#"fenced_lease_degraded{namespace="ns",lease="stuck"} 1"#);
        has(r#"fenced_lease_degraded{namespace="ns",lease="held"} 0"#);
        has(r#"fenced_lease_lease_duration_seconds{namespace="ns",lease="held"} 10"#);
        has(r#"fenced_lease_lease_duration_seconds{namespace="ns",lease="stuck"} 30"#);
        has(r#"fenced_lease_lease_duration_seconds{namespace="ns",lease="idle"} 15"#);
        // 2026-01-01T00:00:10Z: the oldest claim still waiting (not the holder, an expired
        // claim, or one being deleted).
        has(
            r#"fenced_lease_oldest_waiting_claim_created_seconds{namespace="ns",lease="held"} 1767225610"#,
        );
        has(
            r#"fenced_lease_oldest_waiting_claim_created_seconds{namespace="ns",lease="stuck"} 1767225620"#,
        );
        assert!(
            !text.contains(
                r#"fenced_lease_oldest_waiting_claim_created_seconds{namespace="ns",lease="idle"}"#
            ) && !text.contains(r#"lease="missing""#),
            "no series for a lease nobody waits for, nor for a lease that does not exist: {text}"
        );
        has("# TYPE fenced_lease_leader gauge\nfenced_lease_leader 1\n");
        m.leader.set(0);
        assert!(m.encode().contains("fenced_lease_leader 0\n"));
    }
}
