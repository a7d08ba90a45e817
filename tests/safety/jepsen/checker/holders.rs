//! What the library holders believed: overlapping-holders, token-after-loss,
//! expired-while-renewing (I6, I9), and the margin expiry leaves between two holders.

use std::collections::{BTreeMap, HashMap};

use super::{DELETION_HEARD_WITHIN, Kind, Report, Violation, millis, secs};
use crate::history::{Entry, Event};

/// One library holder's claim: its token and the instants it believed it held.
#[derive(Clone, Debug)]
struct Belief<'a> {
    process: &'a str,
    claim: &'a str,
    token: i64,
    /// Return instant of its first `token()` = Ok: it believed by then.
    first_ok: u64,
    /// Call instant of its last `token()` = Ok: it still believed then.
    last_ok: u64,
}

/// A deletion of a lease by the nemesis: (lease, from, to); a holder may hear of one a little
/// after the nemesis is done with it.
type LeaseDeletion<'a> = (&'a str, u64, u64);

/// The nemesis's deletions of leases, each until [`DELETION_HEARD_WITHIN`] after its end.
fn lease_deletions<'a>(entries: &[&'a Entry]) -> Vec<LeaseDeletion<'a>> {
    let mut lease_faults: Vec<LeaseDeletion<'a>> = vec![];
    for e in entries {
        match &e.ev {
            Event::FaultStart {
                kind,
                lease: Some(lease),
                ..
            } if kind.deletes_lease() => lease_faults.push((lease, e.t, u64::MAX)),
            Event::FaultEnd { kind, .. } if kind.deletes_lease() => {
                if let Some(open) = lease_faults.last_mut().filter(|f| f.2 == u64::MAX) {
                    open.2 = e.t + DELETION_HEARD_WITHIN;
                }
            }
            _ => {}
        }
    }
    lease_faults
}

/// What the library holders believed, by (lease, claim), and when each claim was let go
/// (released, dropped: the next grant may follow at once).
struct Beliefs<'a> {
    beliefs: BTreeMap<(&'a str, &'a str), Belief<'a>>,
    let_go: HashMap<&'a str, u64>,
}

/// The library holders' beliefs, with the token-after-loss and expired-while-renewing
/// violations found on the way.
fn beliefs<'a>(
    entries: &[&'a Entry],
    lease_faults: &[LeaseDeletion<'a>],
    r: &mut Report,
) -> Beliefs<'a> {
    let mut beliefs: BTreeMap<(&str, &str), Belief<'_>> = BTreeMap::new();
    let mut lost_at: HashMap<&str, u64> = HashMap::new();
    let mut let_go: HashMap<&str, u64> = HashMap::new();
    let mut acquired_at: HashMap<&str, u64> = HashMap::new();
    for e in entries {
        match &e.ev {
            Event::TokenOk {
                lease,
                claim,
                token,
                called,
            } => {
                if let Some(&lost) = lost_at.get(claim.as_str())
                    && *called > lost
                {
                    r.violations.push(Violation {
                        claims: vec![],
                        kind: Kind::TokenAfterLoss,
                        at: *called,
                        message: format!(
                            "lease {lease}: {} got token() = Ok (token {token}) at {} although lost() had resolved for claim {claim} at {}",
                            e.p,
                            secs(r.start, *called),
                            secs(r.start, lost)
                        ),
                    });
                }
                let b = beliefs.entry((lease, claim)).or_insert(Belief {
                    process: &e.p,
                    claim,
                    token: *token,
                    first_ok: e.t,
                    last_ok: *called,
                });
                b.first_ok = b.first_ok.min(e.t);
                b.last_ok = b.last_ok.max(*called);
            }
            Event::Lost { claim, .. } => {
                lost_at.entry(claim).or_insert(e.t);
                let acquired = acquired_at.get(claim.as_str()).copied().unwrap_or(0);
                expired_while_renewing(e, acquired, lease_faults, r);
            }
            Event::Acquired { claim, .. } => {
                acquired_at.entry(claim).or_insert(e.t);
            }
            Event::Released { claim, how, .. }
                if how != "detached"
                    && how != "after-loss"
                    && !lost_at.contains_key(claim.as_str()) =>
            {
                let_go.entry(claim).or_insert(e.t);
            }
            _ => {}
        }
    }
    Beliefs { beliefs, let_go }
}

/// expired-while-renewing, for a `Lost` entry of a claim acquired at `acquired`: the operator
/// ended the term while the holder's own deadline was ahead, and its lease was not deleted
/// meanwhile.
fn expired_while_renewing(
    e: &Entry,
    acquired: u64,
    lease_faults: &[LeaseDeletion<'_>],
    r: &mut Report,
) {
    let Event::Lost {
        lease,
        claim,
        reason,
        by_operator,
        deadline_in,
    } = &e.ev
    else {
        return;
    };
    let lease_deleted = lease_faults
        .iter()
        .any(|(l, from, to)| *l == lease.as_str() && *from <= e.t && *to >= acquired);
    if *by_operator && *deadline_in > 0 && !lease_deleted {
        r.violations.push(Violation {
            claims: vec![claim.clone()],
            kind: Kind::ExpiredWhileRenewing,
            at: e.t,
            message: format!(
                "lease {lease}: {} (claim {claim}) lost it at {} ({reason}) while its own safe deadline was still {} away: the operator ended the term before the holder's deadline (I9)",
                e.p,
                secs(r.start, e.t),
                millis(*deadline_in),
            ),
        });
    }
}

/// overlapping-holders, token-after-loss and expired-while-renewing.
pub(super) fn holders(entries: &[&Entry], r: &mut Report) {
    let lease_faults = lease_deletions(entries);
    let Beliefs { beliefs, let_go } = beliefs(entries, &lease_faults, r);
    let mut by_lease: BTreeMap<&str, Vec<Belief<'_>>> = BTreeMap::new();
    for ((lease, _), b) in beliefs {
        by_lease.entry(lease).or_default().push(b);
    }
    for (lease, list) in by_lease {
        overlapping_holders(lease, list, &lease_faults, &let_go, r);
    }
}

/// overlapping-holders, among the holders of `lease` (`list`): each holder's first Ok against
/// the latest "still believed" instant of the holders of strictly lower tokens; and the
/// hand-overs where the earlier holder did not let go and the lease was not deleted under it.
fn overlapping_holders(
    lease: &str,
    mut list: Vec<Belief<'_>>,
    lease_faults: &[LeaseDeletion<'_>],
    let_go: &HashMap<&str, u64>,
    r: &mut Report,
) {
    list.sort_by_key(|b| (b.token, b.first_ok));
    // The latest "still believed" instant among the holders of strictly lower tokens.
    let mut latest: Option<Belief<'_>> = None;
    let mut i = 0;
    while i < list.len() {
        let token = list[i].token;
        let same: Vec<Belief<'_>> = list[i..]
            .iter()
            .take_while(|b| b.token == token)
            .cloned()
            .collect();
        for y in &same {
            if let Some(x) = &latest {
                let gap = i64::try_from(y.first_ok).unwrap_or(i64::MAX)
                    - i64::try_from(x.last_ok).unwrap_or(0);
                let deleted_under = lease_faults
                    .iter()
                    .any(|(l, from, to)| *l == lease && *from <= y.first_ok && *to >= x.first_ok);
                if let_go.get(x.claim).is_none_or(|&t| t > y.first_ok) && !deleted_under {
                    r.handovers.push((gap, x.claim.to_string()));
                }
                if gap < 0 {
                    r.violations.push(Violation {
                        claims: vec![x.claim.to_string(), y.claim.to_string()],
                        kind: Kind::OverlappingHolders,
                        at: y.first_ok,
                        message: format!(
                            "lease {lease}: two holders believed they held it at once (I6 + I9): {} (claim {}, token {}) still got token() = Ok at {}, after {} (claim {}, token {}) had got token() = Ok at {} ({} earlier)",
                            x.process,
                            x.claim,
                            x.token,
                            secs(r.start, x.last_ok),
                            y.process,
                            y.claim,
                            y.token,
                            secs(r.start, y.first_ok),
                            millis(-gap),
                        ),
                    });
                }
            }
        }
        for y in same {
            i += 1;
            if latest.as_ref().is_none_or(|x| y.last_ok > x.last_ok) {
                latest = Some(y);
            }
        }
    }
}
