//! Reports what a reconcile did: a log line and the metric for each change of hands, and an
//! Event for each notice the core decided on.

use kube::{Resource, ResourceExt};
use tracing::info;

use crate::core::decide::Plan;
use crate::core::transitions;
use crate::events::Events;
use crate::metrics::Metrics;
use fenced_lease_api::{FencedLease, FencedLeaseStatus};

/// Reports what `plan`, carried out, did to the lease: a log line, the metric, and an Event
/// per transition.
pub fn report(
    events: &Events,
    metrics: &Metrics,
    lease: &FencedLease,
    before: &FencedLeaseStatus,
    plan: &Plan,
) {
    let (ns, name) = (lease.namespace().unwrap_or_default(), lease.name_any());
    let after = lease.status.clone().unwrap_or_default();
    let reference = lease.object_ref(&());
    for notice in transitions::notices(&ns, before, &after, &lease.spec, plan) {
        if let Some(transition) = notice.transition {
            let claim = notice.claim.as_ref().and_then(|c| c.name.as_deref());
            let what = match transition {
                transitions::Transition::Granted => "granted",
                _ => "holder ended",
            };
            info!(lease = %name, namespace = %ns, claim, token = notice.token, reason = notice.reason, "{what}");
            metrics.transitions.count(&ns, &name, transition);
        }
        let (type_, reason, action) = (notice.type_, notice.reason, notice.action);
        events.event_about(&reference, notice.claim, type_, reason, action, notice.note);
    }
}
