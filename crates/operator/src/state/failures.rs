//! Failed reconciles: retried with exponential backoff (not in a tight loop), and reported
//! with one Warning Event per cause rather than one per retry.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use fenced_lease::backoff::Backoff;

/// First retry delay; doubles with each consecutive failure.
const FIRST: Duration = Duration::from_millis(500);
/// Longest retry delay.
const MAX: Duration = Duration::from_secs(60);

/// Consecutive failures per object (`namespace/name`), with the cause of the last one.
#[derive(Debug, Default)]
pub struct Failures {
    by_object: Mutex<HashMap<String, (u32, &'static str)>>,
}

impl Failures {
    /// Records a failure of `key` with `cause`; returns the number of consecutive failures
    /// and whether the cause differs from the previous failure's (worth a new Event).
    pub fn failed(&self, key: &str, cause: &'static str) -> (u32, bool) {
        let mut map = super::locked(&self.by_object);
        let entry = map.entry(key.to_string()).or_insert((0, ""));
        let new_cause = entry.1 != cause;
        entry.0 = entry.0.saturating_add(1);
        entry.1 = cause;
        (entry.0, new_cause)
    }

    /// `key` reconciled successfully: the next failure starts the backoff afresh.
    pub fn succeeded(&self, key: &str) {
        let mut map = super::locked(&self.by_object);
        if !map.is_empty() {
            map.remove(key);
        }
    }
}

/// Pauses before retrying a failed reconcile: 0.5 s doubling up to 60 s, each shortened by
/// up to half at random so that many failing objects spread out.
pub const RETRY: Backoff = Backoff::new(FIRST, MAX, 0.5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_a_minute() {
        assert_eq!(RETRY.delay(1, 1.0), Duration::from_millis(500));
        assert_eq!(RETRY.delay(2, 1.0), Duration::from_secs(1));
        assert_eq!(RETRY.delay(5, 1.0), Duration::from_secs(8));
        assert_eq!(RETRY.delay(30, 1.0), Duration::from_secs(60));
        assert_eq!(RETRY.delay(30, 0.0), Duration::from_secs(30));
    }

    #[test]
    fn one_event_per_cause_and_success_resets() {
        let f = Failures::default();
        assert_eq!(f.failed("ns/l", "ApiError"), (1, true));
        assert_eq!(f.failed("ns/l", "ApiError"), (2, false));
        assert_eq!(f.failed("ns/l", "ApiTimeout"), (3, true));
        f.succeeded("ns/l");
        assert_eq!(f.failed("ns/l", "ApiTimeout"), (1, true));
    }
}
