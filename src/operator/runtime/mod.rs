//! Running the reconcilers: [`run`] wires one feed per watch ([`feeds`]: each keeps its caches
//! and indexes and says which leases to reconcile) to the lease controller; [`watch`]: watches
//! one unreadable object cannot stop; [`merge`]: several namespaces watched as one;
//! [`skeleton`]: objects known by their metadata only;
//! [`sweep`]: every lease reconciled after a (re)list, a few at a time, and deletions paced;
//! [`share`]: each namespace's share of the lease controller; [`runner`]: runs the reconciles
//! of the lease controller and of the claims of missing leases; [`leader`]: leader election;
//! [`http`]: health and metrics endpoints.

pub mod feeds;
pub mod http;
pub mod leader;
pub mod merge;
pub mod run;
pub mod runner;
pub mod share;
pub mod skeleton;
pub mod sweep;
pub mod watch;
