//! When did the operator last *see* each claim's heartbeat change? Expiry is measured on the
//! operator's own monotonic clock from that moment, never by comparing the holder's wall
//! clock with ours (DESIGN "Expire"). A claim seen for the first time — after a restart,
//! say — counts as having just beaten, so a fresh operator gives every holder a full term.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

#[derive(Debug)]
struct Seen {
    beat: Option<String>,
    changed_at: Instant,
}

/// Heartbeat observations, keyed by claim UID.
#[derive(Debug, Default)]
pub struct Heartbeats {
    seen: Mutex<HashMap<String, Seen>>,
}

impl Heartbeats {
    /// Records the heartbeat value `beat` of claim `uid`, seen at `now`.
    pub fn observe(&self, uid: &str, beat: Option<&str>, now: Instant) {
        let mut seen = self.lock();
        match seen.get_mut(uid) {
            Some(s) if s.beat.as_deref() == beat => {}
            Some(s) => {
                s.beat = beat.map(str::to_owned);
                s.changed_at = now;
            }
            None => {
                seen.insert(
                    uid.to_owned(),
                    Seen {
                        beat: beat.map(str::to_owned),
                        changed_at: now,
                    },
                );
            }
        }
    }

    /// Starts the claim's term afresh at `now` (it was just granted the lease).
    pub fn restart_term(&self, uid: &str, now: Instant) {
        if let Some(s) = self.lock().get_mut(uid) {
            s.changed_at = now;
        }
    }

    /// When the heartbeat of `uid` last changed; `now` if it has never been seen.
    pub fn last_change(&self, uid: &str, now: Instant) -> Instant {
        self.lock()
            .entry(uid.to_owned())
            .or_insert(Seen {
                beat: None,
                changed_at: now,
            })
            .changed_at
    }

    /// Forgets a deleted claim.
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        // A panic while holding this lock cannot leave the map inconsistent: use it anyway.
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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
        hb.observe("a", Some("10:00:00"), t0);
        hb.observe("a", Some("10:00:00"), t0 + Duration::from_secs(3));
        assert_eq!(hb.last_change("a", t0 + Duration::from_secs(4)), t0);
        hb.observe("a", Some("10:00:05"), t0 + Duration::from_secs(5));
        assert_eq!(
            hb.last_change("a", t0 + Duration::from_secs(6)),
            t0 + Duration::from_secs(5)
        );
    }

    #[test]
    fn a_grant_restarts_the_term() {
        let hb = Heartbeats::default();
        let t0 = Instant::now();
        hb.observe("a", None, t0);
        hb.restart_term("a", t0 + Duration::from_secs(30));
        assert_eq!(
            hb.last_change("a", t0 + Duration::from_secs(31)),
            t0 + Duration::from_secs(30)
        );
    }
}
