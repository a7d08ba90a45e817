//! The operator: grants leases FIFO, issues fencing tokens, expires silent holders, releases
//! deleted ones, and annotates holder pods.
//!
//! - [`decide`]: who holds next and why a holder stops (pure); [`token`]: the next token.
//! - [`heartbeat`]: when each claim's heartbeat was last seen to change (the expiry clock);
//!   [`expire`]: an expiry confirmed on a fresh read and made final on the claim (I9).
//! - [`cache`]: claims and pods by namespace and name; [`cached`]: claims as cached (compact); [`index`]: claims by lease and by pod, pods by annotated lease (no scans per event).
//! - [`status`]: the lease and claim statuses a decision implies (pure).
//! - [`reconcile`]: the FencedLease reconciler, where a grant is written; [`claims`]: claims
//!   of missing leases ([`runner`] runs them); [`pods`]: pod presence and token annotations; [`high_water`]: the
//!   finalizer that keeps tokens growing across deletion of a lease; [`orphans`]: token
//!   annotations of leases that are gone; [`fence_binding`]: the admission policy binding
//!   that fences a lease's Kubernetes objects (`spec.fenceObjects`).
//! - [`run`]: watches and controllers ([`decode`]: watches one unreadable object cannot stop); [`leader`]: leader election; [`http`]: health and
//!   metrics endpoints; [`metrics`], [`error`], [`context`]; [`events`]: Kubernetes Events, queued and published
//!   off the reconcile path; [`written`]: the operator's own writes its caches have not shown yet;
//!   [`sweep`]: every lease reconciled after a (re)list, a few at a time.

pub mod backoff;
pub mod cache;
pub mod cached;
pub mod claims;
pub mod context;
pub mod decide;
pub mod decode;
pub mod error;
pub mod events;
pub mod expire;
pub mod fence_binding;
pub mod heartbeat;
pub mod high_water;
pub mod http;
pub mod index;
pub mod leader;
pub mod metrics;
pub mod orphans;
pub mod pods;
pub mod reconcile;
pub mod run;
pub mod runner;
pub mod status;
pub mod sweep;
pub mod token;
pub mod wakeups;
pub mod written;
