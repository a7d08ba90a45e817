//! The clock of the local safe deadline (I6): one that keeps counting while the machine is
//! suspended. `std::time::Instant` and tokio's timers use CLOCK_MONOTONIC on Linux, which
//! stops during suspend (a laptop lid, a VM paused with its clock stopped): after resume a
//! deadline measured on it would lie in the future although the lease may have been
//! re-granted meanwhile. So deadlines are kept on CLOCK_BOOTTIME (Linux, Android), on
//! CLOCK_MONOTONIC where that one counts sleep (macOS, iOS), and on CLOCK_MONOTONIC elsewhere.
//!
//! Timers still run on tokio's clock; [`sleep_until`] therefore wakes at least once a second
//! to read this clock again, so a deadline that passed during a suspend is noticed within a
//! second of resume. Readers ([`LeaseHandle::token`](super::LeaseHandle::token)) compare
//! with this clock on every call and are exact.

use std::sync::OnceLock;
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};

/// An instant on the boot clock (time since boot, suspend included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BootInstant(Duration);

/// Longest a timer sleeps before reading the boot clock again.
const RECHECK: Duration = Duration::from_secs(1);

#[cfg(any(target_os = "linux", target_os = "android"))]
const PREFERRED: ClockId = ClockId::CLOCK_BOOTTIME;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const PREFERRED: ClockId = ClockId::CLOCK_MONOTONIC;

/// The clock in use: the preferred one, or CLOCK_MONOTONIC on a kernel without it (Linux
/// before 2.6.39). Chosen once, so that all instants of a process compare.
fn clock() -> ClockId {
    static CLOCK: OnceLock<ClockId> = OnceLock::new();
    *CLOCK.get_or_init(|| {
        if clock_gettime(PREFERRED).is_ok() {
            PREFERRED
        } else {
            tracing::warn!(
                "the boot clock is not available: the safe deadline uses CLOCK_MONOTONIC, which stops while the machine is suspended"
            );
            ClockId::CLOCK_MONOTONIC
        }
    })
}

impl BootInstant {
    /// Now.
    pub fn now() -> Self {
        // CLOCK_MONOTONIC cannot fail with a valid clock id; BOOTTIME was checked in clock().
        let t = clock_gettime(clock())
            .map(Duration::from)
            .unwrap_or_default();
        BootInstant(t)
    }

    /// `self - earlier`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl std::ops::Add<Duration> for BootInstant {
    type Output = BootInstant;

    fn add(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_add(d))
    }
}

impl std::ops::Sub<Duration> for BootInstant {
    type Output = BootInstant;

    fn sub(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_sub(d))
    }
}

/// Sleeps until `deadline` on the boot clock.
pub(crate) async fn sleep_until(deadline: BootInstant) {
    loop {
        let left = deadline.saturating_duration_since(BootInstant::now());
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(RECHECK)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_add_and_subtract_without_overflow() {
        let t = BootInstant(Duration::from_secs(10));
        assert_eq!(
            t + Duration::from_secs(5),
            BootInstant(Duration::from_secs(15))
        );
        assert_eq!(t - Duration::from_secs(15), BootInstant(Duration::ZERO));
        assert_eq!(
            (t + Duration::from_secs(3)).saturating_duration_since(t),
            Duration::from_secs(3)
        );
        assert_eq!(
            t.saturating_duration_since(t + Duration::from_secs(3)),
            Duration::ZERO
        );
    }

    /// The deadline clock is the one that counts suspend: on Linux it agrees with
    /// /proc/uptime (time since boot, suspend included), which CLOCK_MONOTONIC does not once
    /// the machine has been suspended.
    #[cfg(target_os = "linux")]
    #[test]
    fn on_linux_the_deadline_clock_is_boottime() {
        assert_eq!(clock(), ClockId::CLOCK_BOOTTIME);
        let boottime = Duration::from(clock_gettime(ClockId::CLOCK_BOOTTIME).unwrap());
        let ours = BootInstant::now().0;
        assert!(ours >= boottime && ours - boottime < Duration::from_secs(1));
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let diff = (ours.as_secs_f64() - uptime).abs();
        assert!(diff < 1.0, "boot clock {ours:?} vs /proc/uptime {uptime}s");
    }

    #[tokio::test]
    async fn sleep_until_returns_at_the_deadline() {
        let start = BootInstant::now();
        sleep_until(start + Duration::from_millis(30)).await;
        assert!(BootInstant::now().saturating_duration_since(start) >= Duration::from_millis(30));
        // A deadline in the past returns at once.
        sleep_until(start).await;
    }
}
