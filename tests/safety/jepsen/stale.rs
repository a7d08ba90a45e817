//! **stale-writer** (I11): a write to what a lease fences — its labelled ConfigMap, the
//! workload of the kind it fences — that the apiserver accepted from a pod that no longer held
//! the lease.
//!
//! The rule, from the history alone:
//! - a write carries the token its process held (`token`), and the process runs as one pod
//!   of its own (`Spawned`); a process makes its next claim only after its write was answered,
//!   so no later hold of its pod begins while the write is in flight;
//! - that hold ended, in real time, no later than the first sign in the history that the lease
//!   had moved on from the token: a lease status (watched, or read by a stale holder) with a
//!   higher token or with no holder (the same lease object), or a holder told it was granted a
//!   higher token. Each sign is recorded after the change it shows was stored;
//! - the identity rule reads the lease from the apiserver's informer cache, which lags the
//!   store by at most [`Config::identity_allowance`] (an assumption, checked by the figures
//!   below). A write *sent* that long after the sign met a cache that showed another holder,
//!   or none, for as long as it was in flight: the apiserver must have refused it.
//!
//! So a write accepted although sent at least the allowance after that sign is a violation.
//! Not judged: writes that may have met a lease being deleted and created again (the fence
//! goes with the lease, and is back at the new lease's first grant), from the deletion's start
//! until the allowance after that grant; and a followed Lease's leader's writes sent with its
//! term's token before its process learned that the status named its pod again, in a newer
//! term, no later than the allowance after the answer, and showed no other holder (nor none)
//! from then to the allowance before the write was sent. client-go may lead on across terms of
//! the FencedLease (a leader paused while another took the Lease and released it takes it back
//! without its elector stopping; the Lease or the FencedLease created again), and such a
//! leader writes whatever token it last learned: the identity rule rightly lets its pod write.
//!
//! Measured, for the summary: stale writes accepted within the allowance, and how late the
//! latest of them was sent after the sign — a lower bound of the window the cache left open
//! in this run (stale holders probe it: they write right after reading that the lease moved
//! on).

use std::collections::{BTreeMap, HashMap};

use crate::checker::{Config, Kind, Report, Violation, millis, secs};
use crate::history::{Entry, Event, FaultKind};

/// What the identity rule did with the writes pods made (for the summary).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// Writes to what a lease fences by identity, made as a pod, and answered.
    pub answered: usize,
    /// Of those, sent after the writer's hold had ended: refused, and accepted within the
    /// allowance (beyond it, each is a violation).
    pub stale_refused: usize,
    pub stale_accepted: usize,
    /// How long after the sign the latest stale write accepted within the allowance was sent.
    pub latest_accepted: Option<u64>,
    /// Refused by the identity rule although sent before any sign that the writer's hold had
    /// ended: mostly the cache still behind the writer's own grant.
    pub holder_refused: usize,
    /// Not judged: in the window of a lease's deletion.
    pub excused: usize,
    /// Of the answered writes and the stale ones refused: those of the client-go leaders of a
    /// followed Lease (`follow-` processes), which ask nothing before they write.
    pub follower_answered: usize,
    pub follower_stale_refused: usize,
    /// Not judged: sent by a followed Lease's leader with an older term's token, accepted
    /// when the status named its pod again (see the module's header).
    pub renamed: usize,
    /// Lease states with a holder that names no pod (the identity rule then lets no pod write).
    pub holders_without_pod: usize,
}

/// A sign that the lease moved on, or showed who held it.
struct Sign<'a> {
    t: u64,
    token: i64,
    held: bool,
    /// The lease object (a lease status), or `None` (a holder's grant).
    uid: Option<&'a str>,
    /// The holder's pod, and whether it holds a followed Lease (a lease status).
    pod: Option<&'a str>,
    follows: bool,
    what: String,
}

/// A write made as a pod.
struct Write<'a> {
    id: &'a str,
    process: &'a str,
    pod: &'a str,
    lease: &'a str,
    key: &'a str,
    how: Option<&'a str>,
    token: i64,
    sent: u64,
    /// When, whether accepted, and whether refused by the identity rule.
    answer: Option<(u64, bool, bool)>,
}

impl<'a> Sign<'a> {
    /// The sign a lease status (`Event::LeaseState`) gives.
    fn of_state(e: &'a Entry) -> Option<(&'a str, Self)> {
        let Event::LeaseState {
            lease,
            uid,
            holder,
            token,
            pod,
            rv,
            follows,
            ..
        } = &e.ev
        else {
            return None;
        };
        let sign = Sign {
            t: e.t,
            token: *token,
            held: holder.is_some(),
            uid: Some(uid),
            pod: pod.as_deref(),
            follows: follows.is_some(),
            what: format!(
                "{} saw its status at resourceVersion {rv}: token {token}, {}",
                e.p,
                holder
                    .as_deref()
                    .map_or("no holder".into(), |h| format!("holder {h}")),
            ),
        };
        Some((lease, sign))
    }
}

/// What the history says about the writes pods made, and about their leases.
#[derive(Default)]
struct Gathered<'a> {
    /// Each process's pod.
    pods: HashMap<&'a str, &'a str>,
    /// Per lease: the signs that it moved on, or showed who held it.
    signs: BTreeMap<&'a str, Vec<Sign<'a>>>,
    /// Per lease: deletions (start, end), from the nemesis.
    deletions: BTreeMap<&'a str, Vec<(u64, u64)>>,
    writes: Vec<Write<'a>>,
    by_id: HashMap<&'a str, usize>,
    /// The nemesis's deletions under way: their lease and start.
    open: HashMap<FaultKind, (&'a str, u64)>,
    /// Per (process, lease): the grants it learned of, (when, token).
    learned: HashMap<(&'a str, &'a str), Vec<(u64, i64)>>,
}

impl<'a> Gathered<'a> {
    fn gather(entries: &[&'a Entry], r: &mut Report) -> Self {
        let mut g = Gathered::default();
        for e in entries {
            g.record(e, r);
        }
        // A deletion still going on at the end of the history lasts to its end.
        for (lease, start) in std::mem::take(&mut g.open).into_values() {
            g.deletions
                .entry(lease)
                .or_default()
                .push((start, u64::MAX));
        }
        g
    }

    fn record(&mut self, e: &'a Entry, r: &mut Report) {
        match &e.ev {
            Event::Spawned {
                process,
                pod: Some(pod),
                ..
            } => {
                self.pods.insert(process, pod);
            }
            Event::LeaseState { holder, pod, .. } => {
                if holder.is_some() && pod.is_none() {
                    r.identity.holders_without_pod += 1;
                }
                if let Some((lease, sign)) = Sign::of_state(e) {
                    self.signs.entry(lease).or_default().push(sign);
                }
            }
            Event::Acquired { lease, token, .. } | Event::CmdStarted { lease, token, .. } => {
                self.learned
                    .entry((e.p.as_str(), lease.as_str()))
                    .or_default()
                    .push((e.t, *token));
                self.signs.entry(lease).or_default().push(Sign {
                    t: e.t,
                    token: *token,
                    held: true,
                    uid: None,
                    pod: self.pods.get(e.p.as_str()).copied(),
                    follows: false,
                    what: format!("{} was granted token {token}", e.p),
                });
            }
            Event::FaultStart {
                kind,
                lease: Some(lease),
                ..
            } if kind.deletes_lease() => {
                self.open.insert(*kind, (lease, e.t));
            }
            Event::FaultEnd { kind, .. } => {
                if let Some((lease, start)) = self.open.remove(kind) {
                    self.deletions.entry(lease).or_default().push((start, e.t));
                }
            }
            Event::WriteAttempt { .. } => self.write_attempt(e),
            Event::WriteAccepted { id, .. } => self.answer(id, (e.t, true, false)),
            Event::WriteRefused { id, not_holder, .. } => {
                self.answer(id, (e.t, false, not_holder.is_some()));
            }
            _ => {}
        }
    }

    /// A write attempt to what a lease fences by identity, made as a pod.
    fn write_attempt(&mut self, e: &'a Entry) {
        let Event::WriteAttempt {
            id,
            resource,
            key,
            lease,
            token,
            how,
        } = &e.ev
        else {
            return;
        };
        if !resource.fenced_by_identity() {
            return;
        }
        if let Some(pod) = self.pods.get(e.p.as_str()) {
            self.by_id.insert(id, self.writes.len());
            self.writes.push(Write {
                id,
                process: &e.p,
                pod,
                lease,
                key,
                how: how.as_deref(),
                token: *token,
                sent: e.t,
                answer: None,
            });
        }
    }

    fn answer(&mut self, id: &str, answer: (u64, bool, bool)) {
        if let Some(&i) = self.by_id.get(id) {
            self.writes[i].answer = Some(answer);
        }
    }
}

/// stale-writer, and the figures of [`Identity`].
pub fn check(entries: &[&Entry], config: &Config, r: &mut Report) {
    let g = Gathered::gather(entries, r);
    for w in &g.writes {
        judge(w, &g, config.identity_allowance, r);
    }
}

/// Judges one write made as a pod: counts it in [`Identity`], or reports it.
fn judge(w: &Write<'_>, g: &Gathered<'_>, allowance: u64, r: &mut Report) {
    let Some((at, accepted, by_identity)) = w.answer else {
        return;
    };
    r.identity.answered += 1;
    let follower = w.process.starts_with("follow-");
    r.identity.follower_answered += usize::from(follower);
    let lease_signs = g.signs.get(w.lease).map_or(&[][..], Vec::as_slice);
    let lease_deletions = g.deletions.get(w.lease).map_or(&[][..], Vec::as_slice);
    // Inside a deletion window: from its start to the allowance after the first grant
    // that followed it.
    let excused = lease_deletions.iter().any(|&(start, end)| {
        let regranted = lease_signs
            .iter()
            .filter(|s| s.held && s.t > end)
            .map(|s| s.t)
            .min()
            .unwrap_or(u64::MAX);
        at >= start && w.sent < regranted.saturating_add(allowance)
    });
    if excused {
        r.identity.excused += 1;
        return;
    }
    let moved_on = moved_on(lease_signs, lease_deletions, w.token);
    let Some(sign) = moved_on.filter(|s| w.sent >= s.t) else {
        if !accepted && by_identity {
            r.identity.holder_refused += 1;
        }
        return;
    };
    let late = w.sent - sign.t;
    if !accepted {
        r.identity.stale_refused += 1;
        r.identity.follower_stale_refused += usize::from(follower);
    } else if late < allowance {
        r.identity.stale_accepted += 1;
        r.identity.latest_accepted = r.identity.latest_accepted.max(Some(late));
    } else if renamed(lease_signs, &g.learned, w, sign, at, allowance) {
        r.identity.renamed += 1;
    } else {
        // The first grant of a lease created again: its fence binding comes after it.
        let recreated = sign.held
            && lease_deletions.iter().any(|&(_, end)| {
                end <= sign.t
                    && !lease_signs
                        .iter()
                        .any(|s| s.held && s.t > end && s.t < sign.t)
            });
        let message = stale_writer(w, sign, at, recreated, allowance, r.start);
        r.violations.push(Violation {
            claims: vec![],
            kind: Kind::StaleWriter,
            at: w.sent,
            message,
        });
    }
}

/// The message of a stale-writer violation: write `w`, answered at `at`, sent after `sign`.
fn stale_writer(
    w: &Write<'_>,
    sign: &Sign<'_>,
    at: u64,
    recreated: bool,
    allowance: u64,
    start: u64,
) -> String {
    let late = w.sent - sign.t;
    format!(
        "lease {}: {}{} accepted write {} of {} (pod UID {}; it held token {}), sent at {} and answered at {}, {} after the lease had moved on ({} at {}{}): the apiserver must refuse a pod that does not hold the lease (I11; its cache may lag by {} at most)",
        w.lease,
        w.key,
        w.how.map(|h| format!(" ({h})")).unwrap_or_default(),
        w.id,
        w.process,
        w.pod,
        w.token,
        secs(start, w.sent),
        secs(start, at),
        millis(i64::try_from(late).unwrap_or(i64::MAX)),
        sign.what,
        secs(start, sign.t),
        if recreated {
            ", the first grant since the lease was deleted and created again"
        } else {
            ""
        },
        millis(i64::try_from(allowance).unwrap_or(i64::MAX)),
    )
}

/// Was `w` (answered at `at`) a followed Lease's leader's write, sent before its process
/// learned of a newer grant to its pod that the status showed (after `moved`, the first sign
/// the lease moved on) no later than the allowance after the answer, and with no sign of
/// another holder, or none, from that grant to the allowance before it was sent?
fn renamed(
    signs: &[Sign<'_>],
    learned: &HashMap<(&str, &str), Vec<(u64, i64)>>,
    w: &Write<'_>,
    moved: &Sign<'_>,
    at: u64,
    allowance: u64,
) -> bool {
    let knew = |g: &Sign<'_>| {
        learned.get(&(w.process, w.lease)).is_some_and(|grants| {
            grants
                .iter()
                .any(|&(t, token)| token >= g.token && t <= w.sent)
        })
    };
    let lost_since = |g: &Sign<'_>| {
        signs
            .iter()
            .any(|s| s.t > g.t && s.t.saturating_add(allowance) <= w.sent && s.pod != Some(w.pod))
    };
    signs
        .iter()
        .filter(|s| {
            s.follows
                && s.held
                && s.pod == Some(w.pod)
                && s.token > w.token
                && s.t >= moved.t
                && s.t <= at.saturating_add(allowance)
        })
        .any(|g| !knew(g) && !lost_since(g))
}

/// The first sign that the lease moved on from `token`: a higher token, or no holder on the
/// lease object that granted `token` (outside its deletions, when the operator revokes it).
fn moved_on<'s, 'a>(
    signs: &'s [Sign<'a>],
    deletions: &[(u64, u64)],
    token: i64,
) -> Option<&'s Sign<'a>> {
    let granted_by = signs
        .iter()
        .find(|s| s.held && s.token == token && s.uid.is_some())
        .and_then(|s| s.uid);
    signs
        .iter()
        .filter(|s| {
            s.token > token
                || (s.token == token
                    && !s.held
                    && s.uid.is_some()
                    && s.uid == granted_by
                    && !deletions
                        .iter()
                        .any(|&(start, end)| s.t >= start && s.t <= end))
        })
        .min_by_key(|s| s.t)
}
