//! Jittered exponential backoff: the pause before each retry doubles up to a cap, and a random
//! share of it is taken off, so that many clients failing together do not retry in step.

use std::time::Duration;

/// Pauses that double from `first` up to `cap`, each shortened by a random share of at most
/// `jitter`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    jitter: f64,
}

impl Backoff {
    /// Pauses from `first`, doubling with each retry up to `cap`; `jitter` (0..=1) is the
    /// largest share of a pause that chance takes off (0.5: between half and all of it).
    pub const fn new(first: Duration, cap: Duration, jitter: f64) -> Self {
        Backoff { first, cap, jitter }
    }

    /// The pause before retry `attempt` (1-based; 0 counts as 1) for `draw` in 0..=1: `draw`
    /// 1 gives the full pause, 0 the shortest (the full pause less its `jitter` share).
    pub fn delay(&self, attempt: u32, draw: f64) -> Duration {
        let doublings = attempt.max(1) - 1;
        let full = self
            .first
            .saturating_mul(2u32.saturating_pow(doublings))
            .min(self.cap);
        let jitter = self.jitter.clamp(0.0, 1.0);
        let share = 1.0 - jitter + jitter * draw.clamp(0.0, 1.0);
        Duration::try_from_secs_f64(share * full.as_secs_f64()).map_or(full, |d| d.min(full))
    }

    /// The pause before retry `attempt`, with a fresh random draw.
    pub fn pause(&self, attempt: u32) -> Duration {
        self.delay(attempt, rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn backoff() -> Backoff {
        Backoff::new(MS * 200, Duration::from_secs(5), 0.5)
    }

    #[test]
    fn the_full_pause_doubles_from_the_first() {
        let b = backoff();
        assert_eq!(b.delay(1, 1.0), MS * 200);
        assert_eq!(b.delay(2, 1.0), MS * 400);
        assert_eq!(b.delay(3, 1.0), MS * 800);
        assert_eq!(b.delay(5, 1.0), MS * 3200);
        // Attempt 0 is the first retry too.
        assert_eq!(b.delay(0, 1.0), MS * 200);
    }

    #[test]
    fn pauses_stop_growing_at_the_cap_and_never_overflow() {
        let b = backoff();
        assert_eq!(b.delay(6, 1.0), Duration::from_secs(5));
        assert_eq!(b.delay(40, 1.0), Duration::from_secs(5));
        assert_eq!(b.delay(u32::MAX, 1.0), Duration::from_secs(5));
        assert_eq!(b.delay(u32::MAX, 0.0), Duration::from_millis(2500));
        let unbounded = Backoff::new(Duration::MAX / 2, Duration::MAX, 0.5);
        assert_eq!(unbounded.delay(3, 1.0), Duration::MAX);
    }

    #[test]
    fn the_draw_takes_off_at_most_the_jitter_share() {
        let b = backoff();
        assert_eq!(b.delay(1, 0.0), MS * 100);
        assert_eq!(b.delay(1, 0.5), MS * 150);
        assert_eq!(b.delay(3, 0.0), MS * 400);
        // Draws outside 0..=1 count as their nearest bound.
        assert_eq!(b.delay(1, -3.0), MS * 100);
        assert_eq!(b.delay(1, 7.0), MS * 200);
        let steady = Backoff::new(MS * 200, Duration::from_secs(5), 0.0);
        assert_eq!(steady.delay(2, 0.0), MS * 400);
        let full = Backoff::new(MS * 200, Duration::from_secs(5), 1.0);
        assert_eq!(full.delay(2, 0.0), Duration::ZERO);
    }

    #[test]
    fn random_pauses_stay_inside_the_jitter_range_and_vary() {
        let b = backoff();
        for attempt in 1..=8 {
            let full = b.delay(attempt, 1.0);
            let pauses: Vec<Duration> = (0..200).map(|_| b.pause(attempt)).collect();
            assert!(
                pauses.iter().all(|p| *p >= full / 2 && *p <= full),
                "attempt {attempt}: {pauses:?} outside {:?}..={full:?}",
                full / 2
            );
            assert!(
                pauses.iter().any(|p| *p != pauses[0]),
                "attempt {attempt}: no jitter"
            );
        }
    }
}
