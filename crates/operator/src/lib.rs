//! The operator: grants leases FIFO, issues fencing tokens, expires silent holders, releases
//! deleted ones, annotates holder pods, and keeps the kinds slots of the object fence.
//!
//! Its rooms, each importing only those above it in this list:
//! - [`names`], [`error`]: names and keys of leases and claims; errors and API deadlines;
//! - [`scheduler`]: when each lease (and each claim of a missing lease) is reconciled;
//! - [`state`]: what the operator keeps in memory (caches, indexes, clocks);
//! - [`core`]: what to do, decided without I/O;
//! - [`admission`]: the fence's admission objects, whether a lease's fence is in force, and the
//!   keeper of the kinds slots;
//! - [`metrics`], [`events`]: what it reports; [`refusals`]: the refusals holders report; [`context`]: the handles reconcilers share;
//! - [`reconcile`]: making the cluster match the decisions;
//! - [`runtime`]: watches, controllers, leader election, the HTTP endpoints.

#![forbid(unsafe_code)]

pub mod admission;
pub mod context;
pub mod core;
pub mod error;
pub mod events;
pub mod metrics;
pub mod names;
pub mod reconcile;
pub mod refusals;
pub mod runtime;
pub mod scheduler;
pub mod state;
