//! liveness: a killed holder's lease is granted again within the term and the bound (I3).

use std::collections::BTreeSet;

use super::{Config, Kind, Report, Violation, millis, secs};
use crate::history::{Entry, Event, FaultKind};

/// liveness: a killed holder's lease is granted again within the term + the bound.
pub(super) fn liveness(entries: &[&Entry], config: &Config, r: &mut Report) {
    let fault_starts: Vec<u64> = entries
        .iter()
        .filter(|e| matches!(e.ev, Event::FaultStart { .. }))
        .map(|e| e.t)
        .collect();
    let run_end = entries
        .iter()
        .find(|e| matches!(e.ev, Event::RunEnd {}))
        .map_or(u64::MAX, |e| e.t);
    for kill in entries {
        let Event::FaultStart {
            kind: FaultKind::KillHolder | FaultKind::PartitionHolder,
            target: Some(target),
            ..
        } = &kill.ev
        else {
            continue;
        };
        let t_k = kill.t;
        let term = u64::try_from(target.term.max(1)).unwrap_or(1) * 1_000_000_000;
        let deadline = t_k + term + config.liveness_bound;
        let next = entries.iter().filter(|e| e.t > t_k).find(|e| match &e.ev {
            Event::LeaseState {
                lease,
                holder: Some(_),
                token,
                ..
            }
            | Event::Acquired { lease, token, .. }
            | Event::CmdStarted { lease, token, .. } => {
                *lease == target.lease && *token > target.token
            }
            _ => false,
        });
        // Another fault, or the end of the run, before the grant (or the deadline) excuses it.
        let until = next.map_or(deadline, |g| g.t.min(deadline));
        let disturbed = fault_starts.iter().any(|&t| t > t_k && t <= until) || run_end <= until;
        if disturbed || !live_waiter(entries, &target.lease, &target.process, t_k) {
            r.liveness_skipped += 1;
            continue;
        }
        r.liveness_checked += 1;
        match next {
            Some(g) if g.t <= deadline => {
                let over = i64::try_from(g.t - t_k).unwrap_or(i64::MAX) - i64::try_from(term).unwrap_or(0);
                r.worst_regrant_over_term = Some(r.worst_regrant_over_term.map_or(over, |w| w.max(over)));
            }
            other => r.violations.push(Violation {
                claims: vec![],
                kind: Kind::Liveness,
                at: deadline,
                message: format!(
                    "lease {}: its holder {} (claim {}, token {}, term {} s) was killed at {} while another process waited, and the lease was not granted again by {} (term + {}); next grant: {}",
                    target.lease,
                    target.process,
                    target.claim,
                    target.token,
                    target.term,
                    secs(r.start, t_k),
                    secs(r.start, deadline),
                    millis(i64::try_from(config.liveness_bound).unwrap_or(i64::MAX)),
                    other.map_or("none".into(), |g| secs(r.start, g.t)),
                ),
            }),
        }
    }
}

/// Was a process other than `killed` waiting for `lease` at `t`: a library holder between
/// `Waiting` and its outcome, or `kubectl fence run` started and its CMD not yet?
fn live_waiter(entries: &[&Entry], lease: &str, killed: &str, t: u64) -> bool {
    let mut waiting: BTreeSet<&str> = BTreeSet::new();
    for e in entries.iter().take_while(|e| e.t <= t) {
        if e.p == killed {
            continue;
        }
        match &e.ev {
            Event::Waiting { lease: l } if l == lease => {
                waiting.insert(&e.p);
            }
            Event::Spawned {
                process, lease: l, ..
            } if l == lease && process.starts_with("cli-") => {
                waiting.insert(process);
            }
            Event::Acquired { .. } | Event::AcquireFailed { .. } | Event::CmdStarted { .. } => {
                waiting.remove(e.p.as_str());
            }
            Event::Exited { process, .. } => {
                waiting.remove(process.as_str());
            }
            _ => {}
        }
    }
    !waiting.is_empty()
}
