//! token-issued-twice and grant-order (I1).

use std::collections::{BTreeMap, BTreeSet};

use super::{Kind, Report, Violation, secs};
use crate::history::{Entry, Event};

/// Who was seen holding (lease, token), first sighting per claim.
struct Sighting<'a> {
    claim: &'a str,
    at: u64,
    how: String,
}

/// token-issued-twice and grant-order.
pub(super) fn tokens(entries: &[&Entry], r: &mut Report) {
    issued_once(entries, r);
    grant_order(entries, r);
}

/// token-issued-twice: each (lease, token) seen held by one claim only; and the grants the
/// watch and the holders saw, counted.
fn issued_once(entries: &[&Entry], r: &mut Report) {
    let mut seen: BTreeMap<(&str, i64), Vec<Sighting<'_>>> = BTreeMap::new();
    let mut watched: BTreeSet<(&str, i64)> = BTreeSet::new();
    let mut held: BTreeSet<(&str, i64)> = BTreeSet::new();
    for e in entries {
        let (lease, claim, token, how) = match &e.ev {
            Event::Acquired {
                lease,
                claim,
                token,
            } => {
                held.insert((lease.as_str(), *token));
                (lease, claim, *token, format!("{} acquired it", e.p))
            }
            Event::CmdStarted {
                lease,
                claim,
                token,
                ..
            } => {
                held.insert((lease.as_str(), *token));
                (
                    lease,
                    claim,
                    *token,
                    format!("{} (kubectl fence run) started with it", e.p),
                )
            }
            Event::LeaseState {
                lease,
                holder: Some(holder),
                token,
                rv,
                ..
            } => {
                // Not a stale holder's own read of the lease.
                if e.p == "observer" {
                    watched.insert((lease.as_str(), *token));
                }
                (
                    lease,
                    holder,
                    *token,
                    format!("the lease status said so (resourceVersion {rv})"),
                )
            }
            _ => continue,
        };
        let sightings = seen.entry((lease.as_str(), token)).or_default();
        if sightings.iter().any(|s| s.claim == claim.as_str()) {
            continue;
        }
        if let Some(first) = sightings.first() {
            r.violations.push(Violation {
                claims: vec![],
                kind: Kind::TokenIssuedTwice,
                at: e.t,
                message: format!(
                    "lease {lease}: token {token} was issued twice: to claim {} at {} ({}), and to claim {claim} at {} ({how})",
                    first.claim,
                    secs(r.start, first.at),
                    first.how,
                    secs(r.start, e.t),
                ),
            });
        }
        sightings.push(Sighting {
            claim,
            at: e.t,
            how,
        });
    }
    let both: BTreeSet<_> = watched.union(&held).copied().collect();
    r.grants = both.len();
    r.grants_watched = watched.len();
    r.grants_held = held.len();
}

/// grant-order: grants in etcd revision order, per lease name (across deletions and
/// re-creations), carry strictly increasing tokens.
fn grant_order(entries: &[&Entry], r: &mut Report) {
    let mut states: BTreeMap<&str, Vec<(u64, u64, &str, i64)>> = BTreeMap::new();
    for e in entries {
        if let Event::LeaseState {
            lease,
            holder: Some(holder),
            token,
            rv,
            ..
        } = &e.ev
        {
            states
                .entry(lease)
                .or_default()
                .push((*rv, e.t, holder, *token));
        }
    }
    for (lease, mut list) in states {
        list.sort_by_key(|s| s.0);
        let mut last: Option<(&str, i64)> = None;
        let mut highest: Option<(u64, &str, i64)> = None;
        for (rv, t, holder, token) in list {
            if last == Some((holder, token)) {
                continue;
            }
            last = Some((holder, token));
            if let Some((hrv, hclaim, htoken)) = highest
                && token < htoken
            {
                r.violations.push(Violation {
                    claims: vec![],
                    kind: Kind::GrantOrder,
                    at: t,
                    message: format!(
                        "lease {lease}: granted token {token} to claim {holder} (resourceVersion {rv}) after token {htoken} to claim {hclaim} (resourceVersion {hrv}): tokens must increase in grant order"
                    ),
                });
                continue;
            }
            if highest.is_none_or(|h| token > h.2) {
                highest = Some((rv, holder, token));
            }
        }
    }
}
