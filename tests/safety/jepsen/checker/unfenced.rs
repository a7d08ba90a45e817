//! collateral-refusal: the apiserver refused a write no existing lease fences (I12), and
//! each refusal's cause.

use std::collections::HashMap;

use super::{Kind, RESTART_GRACE, Report, Violation, secs};
use crate::history::{Entry, Event, FaultKind, Resource};

/// A refusal of the apiserver that cannot read FencedLeases yet (after it starts): it has not
/// discovered the CRD (`failed to configure policy`, kubernetes#124237), or its informer of
/// them has not listed them yet (`not yet synced`).
pub(super) fn unconfigured(refusal: &str) -> bool {
    refusal.contains("failed to configure policy")
        || refusal.contains("not yet synced to use for admission")
}

/// What refused a write no lease fences, in a few words (from the apiserver's message).
pub fn refusal_cause(refusal: &str) -> &'static str {
    if refusal.contains("no params found") {
        "a binding whose lease is gone (parameterNotFoundAction: Deny)"
    } else if refusal.contains("not yet synced to use for admission") {
        "the apiserver's informer of FencedLeases, not yet synced"
    } else if refusal.contains("failed to configure policy") {
        "a policy the apiserver cannot configure (its params kind)"
    } else if refusal.contains("resulted in error") {
        "an expression of a policy that fails to evaluate"
    } else if refusal.contains("does not hold") {
        "the identity rule (does not hold)"
    } else if refusal.contains("fencing.dev/token") {
        "the token rule"
    } else if refusal.contains("denied request") || refusal.contains("ValidatingAdmissionPolicy") {
        "another admission policy"
    } else {
        "other (not admission)"
    }
}

/// collateral-refusal: every refusal of a write no lease fences, but `failed to configure
/// policy` from the start of a control-plane restart to [`RESTART_GRACE`] after its end.
/// The lease a refusal by the lease rules names (`... FencedLease <namespace>/<lease> (...`).
fn refusing_lease(refusal: &str) -> Option<&str> {
    let rest = refusal.split("FencedLease ").nth(1)?;
    let qualified = rest.split(' ').next()?;
    qualified.split('/').nth(1)
}

pub(super) fn collateral(entries: &[&Entry], r: &mut Report) {
    let mut restarts: Vec<(u64, u64)> = vec![];
    for e in entries {
        match &e.ev {
            Event::FaultStart {
                kind: FaultKind::RestartApiserver | FaultKind::RestartEtcd,
                ..
            } => restarts.push((e.t, u64::MAX)),
            Event::FaultEnd {
                kind: FaultKind::RestartApiserver | FaultKind::RestartEtcd,
                ..
            } => {
                if let Some(open) = restarts.last_mut().filter(|w| w.1 == u64::MAX) {
                    open.1 = e.t.saturating_add(RESTART_GRACE);
                }
            }
            _ => {}
        }
    }
    let mut gone: HashMap<&str, Vec<u64>> = HashMap::new();
    for e in entries {
        if let Event::LeaseGone { lease, .. } = &e.ev {
            gone.entry(lease.as_str()).or_default().push(e.t);
        }
    }
    let allowance = r.identity_allowance;
    let mut sent: HashMap<&str, (&str, &str, Option<&str>, u64)> = HashMap::new();
    for e in entries {
        match &e.ev {
            Event::WriteAttempt {
                id,
                resource: Resource::Unfenced,
                key,
                how,
                ..
            } => {
                sent.insert(id, (&e.p, key, how.as_deref(), e.t));
            }
            Event::WriteAccepted { id, .. } if sent.contains_key(id.as_str()) => {
                r.collateral.answered += 1;
            }
            Event::WriteRefused { id, refusal, .. } => {
                let Some(&(process, key, how, at)) = sent.get(id.as_str()) else {
                    continue;
                };
                let refusal = refusal.as_deref().unwrap_or("(no message recorded)");
                r.collateral.answered += 1;
                r.collateral.refused += 1;
                let cause = refusal_cause(refusal);
                *r.collateral.causes.entry(cause).or_default() += 1;
                let restarting = restarts.iter().any(|&(from, to)| at >= from && at <= to);
                if restarting && unconfigured(refusal) {
                    r.collateral.unconfigured += 1;
                    continue;
                }
                let by_lease = refusing_lease(refusal).and_then(|l| gone.get(l));
                if by_lease.is_some_and(|ts| ts.iter().any(|&t| at.abs_diff(t) <= allowance)) {
                    r.collateral.lagging += 1;
                    continue;
                }
                r.violations.push(Violation {
                    claims: vec![],
                    kind: Kind::Collateral,
                    at,
                    message: format!(
                        "{key}: write {id} of {process} ({}), which no existing lease fences, sent at {} and refused at {}: {refusal} (I12: nothing the operator leaves behind may refuse a write no existing lease fences; cause: {cause})",
                        how.unwrap_or("-"),
                        secs(r.start, at),
                        secs(r.start, e.t),
                    ),
                });
            }
            _ => {}
        }
    }
}
