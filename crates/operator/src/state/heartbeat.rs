//! When did the operator last *see* each claim's heartbeat change? Expiry is measured on the
//! operator's own monotonic clock from that moment, never by comparing the holder's wall
//! clock with ours (DESIGN "Expire"). A claim seen for the first time — after a restart,
//! say — counts as having just beaten, so a fresh operator gives every holder a full term.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use k8s_openapi::jiff::Timestamp;

use fenced_lease_api::FencedLeaseClaimSpec;

/// The heartbeat value of a claim, as compared between observations (its `renewTime`, kept
/// as a timestamp rather than its text: no allocation per claim).
pub fn beat_of(spec: &FencedLeaseClaimSpec) -> Option<Timestamp> {
    spec.renew_time.as_ref().map(|t| t.0)
}

#[derive(Debug)]
struct Seen {
    beat: Option<Timestamp>,
    changed_at: Instant,
    /// A hash of the rest of the claim its lease's decision reads (see [`Heartbeats::observe`]).
    print: Option<u64>,
}

/// Heartbeat observations, keyed by claim UID.
#[derive(Debug, Default)]
pub struct Heartbeats {
    seen: Mutex<HashMap<String, Seen>>,
}

impl Heartbeats {
    /// Records the heartbeat value `beat` of claim `uid`, seen at `now`, and, from a watch
    /// event, `print`: a hash of everything else of the claim a lease's decision reads. Returns
    /// whether that changed (or the claim is new): a change of the heartbeat alone needs no
    /// reconcile of the lease, whose timer already wakes it at the holder's deadline.
    pub fn observe(
        &self,
        uid: &str,
        beat: Option<Timestamp>,
        print: Option<u64>,
        now: Instant,
    ) -> bool {
        let mut seen = super::locked(&self.seen);
        match seen.get_mut(uid) {
            Some(s) => {
                if s.beat != beat {
                    s.beat = beat;
                    s.changed_at = now;
                }
                let changed = print.is_some() && s.print != print;
                s.print = print.or(s.print);
                changed
            }
            None => {
                seen.insert(
                    uid.to_owned(),
                    Seen {
                        beat,
                        changed_at: now,
                        print,
                    },
                );
                true
            }
        }
    }

    /// Starts every claim's clock afresh at `now`: after a watch error or relist the operator
    /// may have missed heartbeats, so it gives every holder a full term, as a restart does.
    pub fn restart_all(&self, now: Instant) {
        for seen in super::locked(&self.seen).values_mut() {
            seen.changed_at = seen.changed_at.max(now);
        }
    }

    /// When the heartbeat of `uid` last changed; `now` if it has never been seen.
    pub fn last_change(&self, uid: &str, now: Instant) -> Instant {
        let mut seen = super::locked(&self.seen);
        if let Some(s) = seen.get(uid) {
            return s.changed_at; // no key copied: this runs for every claim of a lease
        }
        let first = Seen {
            beat: None,
            changed_at: now,
            print: None,
        };
        seen.insert(uid.to_owned(), first);
        now
    }

    /// Whether claim `uid`, whose heartbeat the operator had last seen change at `seen_at`
    /// when it decided to expire it, has shown life since: `read` (its heartbeat as just read
    /// from the API) differs from the last value seen, or the watch saw a change (or a relist
    /// restarted its clock) after `seen_at`. The second half matters: a watch event can bring
    /// the very value of the fresh read between the decision and this check, and comparing
    /// values alone would then call a renewing claim silent.
    pub fn moved_since(&self, uid: &str, read: Option<Timestamp>, seen_at: Instant) -> bool {
        match super::locked(&self.seen).get(uid) {
            Some(s) => s.beat != read || s.changed_at > seen_at,
            None => true,
        }
    }

    /// Forgets a deleted claim.
    pub fn forget(&self, uid: &str) {
        super::locked(&self.seen).remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A heartbeat value: `s` seconds past 10:00.
    fn at(s: i64) -> Option<Timestamp> {
        Some(Timestamp::from_second(1_764_496_800 + s).unwrap())
    }

    #[test]
    fn unseen_claim_gets_a_full_term_from_now() {
        let hb = Heartbeats::default();
        let now = Instant::now();
        assert_eq!(hb.last_change("a", now), now);
        assert_eq!(
            hb.last_change("a", now + Duration::from_secs(5)),
            now,
            "the first sighting sticks"
        );
    }

    #[test]
    fn only_a_changed_value_moves_the_clock() {
        let hb = Heartbeats::default();
        let t0 = Instant::now();
        hb.observe("a", at(0), None, t0);
        hb.observe("a", at(0), None, t0 + Duration::from_secs(3));
        assert_eq!(hb.last_change("a", t0 + Duration::from_secs(4)), t0);
        hb.observe("a", at(5), None, t0 + Duration::from_secs(5));
        assert_eq!(
            hb.last_change("a", t0 + Duration::from_secs(6)),
            t0 + Duration::from_secs(5)
        );
    }

    #[test]
    fn a_beat_the_watch_brought_after_the_decision_is_life() {
        let hb = Heartbeats::default();
        let t0 = Instant::now();
        hb.observe("a", at(0), None, t0);
        // Decided on t0 (silent for a term); the fresh read shows the same value: silent.
        assert!(!hb.moved_since("a", at(0), t0));
        // The fresh read shows a newer value than the operator has seen: alive.
        assert!(hb.moved_since("a", at(5), t0));
        // The watch delivered that newer value between the decision and the check: the
        // values now match, but the clock moved after the decision: alive all the same.
        hb.observe("a", at(5), None, t0 + Duration::from_secs(5));
        assert!(hb.moved_since("a", at(5), t0));
        // A relist restarted the clock after the decision: alive (a full term from it).
        hb.observe("b", at(0), None, t0);
        hb.restart_all(t0 + Duration::from_secs(1));
        assert!(hb.moved_since("b", at(0), t0));
        // Never seen: alive.
        assert!(hb.moved_since("c", None, t0));
    }

    #[test]
    fn only_a_change_besides_the_heartbeat_asks_for_a_reconcile() {
        let hb = Heartbeats::default();
        let t0 = Instant::now();
        assert!(hb.observe("a", at(0), Some(1), t0), "a new claim");
        assert!(!hb.observe("a", at(5), Some(1), t0), "a heartbeat");
        assert_eq!(
            hb.last_change("a", t0 + Duration::from_secs(9)),
            t0,
            "same instant passed"
        );
        assert!(hb.observe("a", at(5), Some(2), t0), "its status changed");
        // A claim first seen by a lease's reconcile is new to the watch too.
        hb.last_change("b", t0);
        assert!(hb.observe("b", None, Some(7), t0));
    }

    #[test]
    fn a_relist_restarts_every_clock() {
        let hb = Heartbeats::default();
        let t0 = Instant::now();
        hb.observe("a", at(0), None, t0);
        hb.observe("b", None, None, t0);
        hb.restart_all(t0 + Duration::from_secs(30));
        for uid in ["a", "b"] {
            assert_eq!(
                hb.last_change(uid, t0 + Duration::from_secs(31)),
                t0 + Duration::from_secs(30)
            );
        }
        // The value is kept: the same value read after the restart is no change.
        assert!(!hb.moved_since("a", at(0), t0 + Duration::from_secs(30)));
    }
}
