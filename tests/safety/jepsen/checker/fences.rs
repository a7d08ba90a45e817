//! fence-accepted-lower, fence-refused-applied, accepted-write-missing: each fenced
//! resource's writes against its own log and against real time.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Kind, Report, Violation, secs};
use crate::history::{Entry, Event, LogEntry, Resource};

/// A write as its writer recorded it.
struct Write<'a> {
    process: &'a str,
    resource: Resource,
    key: &'a str,
    token: i64,
    attempted: u64,
    outcome: Outcome,
}

#[derive(Clone, Copy, PartialEq)]
enum Outcome {
    Unknown,
    Accepted { at: u64, seq: Option<u64> },
    Refused,
}

/// Each resource key's accepted writes, by their position in its order.
type Logs<'a> = BTreeMap<(Resource, &'a str), BTreeMap<u64, LogEntry>>;

/// fence-accepted-lower, fence-refused-applied, accepted-write-missing.
pub(super) fn fences(entries: &[&Entry], r: &mut Report) {
    let writes = writes_to_fences(entries);
    let (logs, complete) = accepted_orders(entries, &writes);
    let reported = check_orders(&logs, &complete, &writes, r);
    check_real_time(&writes, &reported, r);
}

/// The writes to resources that check tokens, by write id, with their outcomes.
fn writes_to_fences<'a>(entries: &[&'a Entry]) -> BTreeMap<&'a str, Write<'a>> {
    let mut writes: BTreeMap<&str, Write<'_>> = BTreeMap::new();
    for e in entries {
        match &e.ev {
            Event::WriteAttempt {
                id,
                resource,
                key,
                token,
                ..
            } if resource.checks_tokens() => {
                writes.insert(
                    id,
                    Write {
                        process: &e.p,
                        resource: *resource,
                        key,
                        token: *token,
                        attempted: e.t,
                        outcome: Outcome::Unknown,
                    },
                );
            }
            Event::WriteAccepted { id, seq } => {
                if let Some(w) = writes.get_mut(id.as_str()) {
                    w.outcome = Outcome::Accepted { at: e.t, seq: *seq };
                }
            }
            Event::WriteRefused { id, .. } => {
                if let Some(w) = writes.get_mut(id.as_str()) {
                    w.outcome = Outcome::Refused;
                }
            }
            _ => {}
        }
    }
    writes
}

/// Each resource key's order of accepted writes: its own log (complete) where there is one,
/// else what the watch and the writers saw (by resourceVersion); and the keys whose log is
/// complete.
fn accepted_orders<'a>(
    entries: &[&'a Entry],
    writes: &BTreeMap<&'a str, Write<'a>>,
) -> (Logs<'a>, BTreeSet<(Resource, &'a str)>) {
    let mut logs: Logs<'a> = BTreeMap::new();
    let mut complete: BTreeSet<(Resource, &str)> = BTreeSet::new();
    for e in entries {
        match &e.ev {
            Event::ResourceLog {
                resource,
                key,
                entries,
            } => {
                complete.insert((*resource, key));
                let log = logs.entry((*resource, key)).or_default();
                for entry in entries {
                    log.insert(entry.seq, entry.clone());
                }
            }
            Event::ObjectState {
                key,
                rv,
                token: Some(token),
                write,
            } => {
                logs.entry((Resource::Kube, key))
                    .or_default()
                    .entry(*rv)
                    .or_insert(LogEntry {
                        seq: *rv,
                        token: *token,
                        write: write.clone().unwrap_or_default(),
                    });
            }
            _ => {}
        }
    }
    for (id, w) in writes {
        if let Outcome::Accepted { seq: Some(seq), .. } = w.outcome
            && !complete.contains(&(w.resource, w.key))
        {
            logs.entry((w.resource, w.key))
                .or_default()
                .entry(seq)
                .or_insert(LogEntry {
                    seq,
                    token: w.token,
                    write: id.to_string(),
                });
        }
    }
    (logs, complete)
}

/// By each resource's own order: a token accepted below one accepted before it
/// (fence-accepted-lower), a write reported refused that the log has (fence-refused-applied),
/// one reported accepted that a complete log lacks (accepted-write-missing). The writes
/// already reported as accepted lower.
fn check_orders(
    logs: &Logs<'_>,
    complete: &BTreeSet<(Resource, &str)>,
    writes: &BTreeMap<&str, Write<'_>>,
    r: &mut Report,
) -> BTreeSet<String> {
    let when = |write: &str| writes.get(write).map_or(r.end, |w| w.attempted);
    let mut reported: BTreeSet<String> = BTreeSet::new();
    for ((resource, key), log) in logs {
        let mut highest: Option<&LogEntry> = None;
        for entry in log.values() {
            if let Some(h) = highest
                && entry.token < h.token
            {
                reported.insert(entry.write.clone());
                r.violations.push(Violation {
                    claims: vec![],
                    kind: Kind::FenceAcceptedLower,
                    at: when(&entry.write),
                    message: format!(
                        "{} {key} accepted token {} (write {}, position {}) after token {} (write {}, position {}): a fence must refuse a token lower than one it accepted",
                        resource.describe(),
                        entry.token,
                        entry.write,
                        entry.seq,
                        h.token,
                        h.write,
                        h.seq,
                    ),
                });
            }
            if highest.is_none_or(|h| entry.token > h.token) {
                highest = Some(entry);
            }
        }
        let in_log: HashMap<&str, &LogEntry> =
            log.values().map(|e| (e.write.as_str(), e)).collect();
        let log_complete = complete.contains(&(*resource, *key));
        for (id, w) in writes
            .iter()
            .filter(|(_, w)| w.resource == *resource && w.key == *key)
        {
            if let Some(v) = logged_as_answered(id, w, in_log.contains_key(id), log_complete) {
                r.violations.push(v);
            }
        }
    }
    reported
}

/// fence-refused-applied or accepted-write-missing, for write `id` (`w`), which the
/// resource's log has or not (`in_log`), that log complete or not.
fn logged_as_answered(id: &str, w: &Write<'_>, in_log: bool, complete: bool) -> Option<Violation> {
    let (resource, key) = (w.resource, w.key);
    match w.outcome {
        Outcome::Refused if in_log => Some(Violation {
            claims: vec![],
            kind: Kind::FenceRefusedApplied,
            at: w.attempted,
            message: format!(
                "{} {key}: write {id} of {} (token {}) was reported refused, yet the resource applied it",
                resource.describe(),
                w.process,
                w.token
            ),
        }),
        Outcome::Accepted { at, .. } if complete && !in_log => Some(Violation {
            claims: vec![],
            kind: Kind::AcceptedWriteMissing,
            at,
            message: format!(
                "{} {key}: write {id} of {} (token {}) was reported accepted, but the resource's log does not have it",
                resource.describe(),
                w.process,
                w.token
            ),
        }),
        _ => None,
    }
}

/// fence-accepted-lower by real time: a write accepted before another was even sent, with a
/// higher token (a write already `reported` aside).
fn check_real_time(
    writes: &BTreeMap<&str, Write<'_>>,
    reported: &BTreeSet<String>,
    r: &mut Report,
) {
    let mut per_key: BTreeMap<(Resource, &str), Vec<(&str, &Write<'_>)>> = BTreeMap::new();
    for (id, w) in writes {
        if matches!(w.outcome, Outcome::Accepted { .. }) {
            per_key
                .entry((w.resource, w.key))
                .or_default()
                .push((id, w));
        }
    }
    for ((resource, key), list) in per_key {
        if let Some(v) = accepted_lower_in_time(resource, key, &list, reported, r.start) {
            r.violations.push(v);
        }
    }
}

/// The first write of `list` (the accepted writes of one resource key) sent after the resource
/// had accepted a higher token, as a violation.
fn accepted_lower_in_time(
    resource: Resource,
    key: &str,
    list: &[(&str, &Write<'_>)],
    reported: &BTreeSet<String>,
    start: u64,
) -> Option<Violation> {
    // Sweep: completions and starts in time order; a start below the highest completed
    // token is a regression the resource cannot have ordered otherwise.
    let mut points: Vec<(u64, bool, usize)> = vec![];
    for (i, (_, w)) in list.iter().enumerate() {
        if let Outcome::Accepted { at, .. } = w.outcome {
            points.push((at, true, i));
        }
        points.push((w.attempted, false, i));
    }
    points.sort_by_key(|p| (p.0, !p.1));
    let mut highest: Option<usize> = None;
    for (_, done, i) in points {
        let (id, w) = list[i];
        if done {
            if highest.is_none_or(|h| w.token > list[h].1.token) {
                highest = Some(i);
            }
        } else if let Some(h) = highest
            && w.token < list[h].1.token
            && !reported.contains(id)
        {
            let (hid, hw) = list[h];
            let message = format!(
                "{} {key} accepted token {} (write {id} of {}, sent at {}) after it had accepted token {} (write {hid} of {}, answered at {}): a fence must refuse a token lower than one it accepted",
                resource.describe(),
                w.token,
                w.process,
                secs(start, w.attempted),
                hw.token,
                hw.process,
                secs(
                    start,
                    match hw.outcome {
                        Outcome::Accepted { at, .. } => at,
                        _ => 0,
                    }
                ),
            );
            // One per regressing write is enough.
            return Some(Violation {
                claims: vec![],
                kind: Kind::FenceAcceptedLower,
                at: w.attempted,
                message,
            });
        }
    }
    None
}
