//! Running the reconcilers: [`run`] wires one feed per watch ([`feeds`]: each keeps its caches
//! and indexes and says which leases to reconcile) to the [`scheduler`](super::scheduler)s of
//! the leases and of the claims of missing leases; [`watch`]: watches one unreadable object
//! cannot stop; [`merge`]: several namespaces watched as one; [`skeleton`]: objects known by
//! their metadata only; [`leader`]: leader election; [`http`]: health and metrics endpoints.

pub mod feeds;
pub mod http;
pub mod leader;
pub mod merge;
pub mod run;
pub mod skeleton;
pub mod watch;
