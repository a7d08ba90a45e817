//! The holder side: taking a lease, keeping it with heartbeats, and knowing, from the holder's
//! own clock, the last instant it may still act as holder (invariant I6).
//!
//! - [`acquire`](fn@acquire) queues a fresh claim and returns a [`LeaseGuard`] once it is granted;
//! - the guard renews in the background, gives out its [`token`](LeaseHandle::token) only
//!   before its local safe deadline (send time of the last accepted renew + the term's
//!   duration − a margin, on a clock that counts suspend), signals
//!   [`lost`](LeaseHandle::lost), and releases the lease when released or dropped;
//! - [`elect`] builds fenced leader election on it;
//! - `kubectl fence` (the crate `kubectl-fence`) is this module on the command line.
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
//!
//! Dropping the guard releases the lease, so it must be bound to a name; a guard that is
//! not used is a compile-time warning:
//! ```compile_fail
//! #![deny(unused_must_use)]
//! # async fn demo(client: kube::Client) {
//! use fenced_lease::holder::{AcquireOptions, acquire};
//! acquire(client, "default", "db", AcquireOptions::default()).await.unwrap();
//! # }
//! ```

mod acquire;
mod budget;
mod claim;
mod clock;
mod create;
mod election;
mod error;
mod guard;
mod keeper;
mod options;
pub mod refusals;
mod state;

pub use acquire::acquire;
pub use election::{ElectOptions, Leadership, elect};
pub use error::{Error, LostReason, Source, report};
pub use guard::{DetachedClaim, LeaseGuard, LeaseHandle, Refusal};
pub use options::{
    AcquireOptions, PodRef, SERVICE_ACCOUNT_NAMESPACE_FILE, Timing, default_identity,
};
pub use refusals::register_metrics;
pub use state::HoldState;
