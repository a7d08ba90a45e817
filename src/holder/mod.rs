//! The holder side: taking a lease, keeping it with heartbeats, and knowing, from the holder's
//! own clock, the last instant it may still act as holder (invariant I6).
//!
//! - [`acquire`] queues a fresh claim and returns a [`LeaseGuard`] once it is granted;
//! - the guard renews in the background, gives out its [`token`](LeaseHandle::token) only
//!   before its local safe deadline, signals [`lost`](LeaseHandle::lost), and releases the
//!   lease when released or dropped;
//! - [`elect`] builds fenced leader election on it;
//! - [`cli`] is `kubectl fence`.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), fenced_lease::holder::Error> {
//! use std::time::Duration;
//! use fenced_lease::holder::{AcquireOptions, acquire};
//!
//! let guard = acquire(client, "default", "db-migrate",
//!     AcquireOptions::default().wait(Duration::from_secs(30))).await?;
//! let token = guard.token()?; // send it with every write to the protected resource
//! println!("holding db-migrate with token {token}");
//! guard.release().await?;
//! # Ok(()) }
//! ```
//! Nothing here depends on the operator.

use std::time::{Duration, Instant};

mod acquire;
mod claim;
pub mod cli;
mod election;
mod error;
mod guard;
mod keeper;
mod options;
mod state;

pub use acquire::acquire;
pub use election::{ElectOptions, elect};
pub use error::{Error, LostReason};
pub use guard::{DetachedClaim, LeaseGuard, LeaseHandle};
pub use options::{AcquireOptions, PodRef, Timing, default_identity};
pub use state::HoldState;

/// The local safe deadline of a holder: the *send* time of its last successful renew, plus
/// the lease duration, minus a safety margin. The operator cannot expire the holder before
/// it has seen that renew, which it cannot do before it was sent, so until this instant no
/// one else can have been granted the lease (clock rate drift aside, which the margin covers).
pub fn safe_deadline(
    last_renew_sent: Instant,
    lease_duration: Duration,
    margin: Duration,
) -> Instant {
    last_renew_sent + lease_duration.saturating_sub(margin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_is_duration_minus_margin_after_the_send() {
        let sent = Instant::now();
        let d = safe_deadline(sent, Duration::from_secs(15), Duration::from_secs(2));
        assert_eq!(d - sent, Duration::from_secs(13));
    }

    #[test]
    fn margin_larger_than_duration_means_no_time_at_all() {
        let sent = Instant::now();
        assert_eq!(
            safe_deadline(sent, Duration::from_secs(1), Duration::from_secs(5)),
            sent
        );
    }
}
