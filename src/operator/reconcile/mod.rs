//! Making the cluster match the decisions: the FencedLease reconciler ([`lease`]: a lease's
//! status written, the linearization point; [`finalize`]: a deleted lease; [`claims`]: its
//! claims' statuses), and what it calls: [`expire`] (an expiry confirmed on a fresh read and
//! made final, I9), [`pods`] (pod presence and token annotations), [`token_records`] (the
//! finalizer that keeps tokens growing across deletion of a lease), [`fence_bindings`]. Apart:
//! [`missing_lease`] (claims of leases that do not exist), [`orphans`] (token annotations
//! of leases that are gone) and [`positions`] (waiters' queue positions, written off the
//! hand-over's path).

pub mod claims;
pub mod expire;
pub mod fence_bindings;
pub mod finalize;
pub mod lease;
mod lookup;
pub mod missing_lease;
pub mod orphans;
pub mod pods;
pub mod positions;
pub mod report;
pub mod token_records;
mod write_status;
