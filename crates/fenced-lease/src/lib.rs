//! fenced-lease: mutual exclusion on Kubernetes with a fencing token, the holder's side.
//!
//! A lease alone cannot give mutual exclusion: it expires, and a stalled holder does not know
//! it has. Each grant therefore carries a fencing token that only grows, and the protected
//! resource refuses any write carrying a token lower than the highest it has accepted.
//!
//! - [`api`]: the `FencedLease` and `FencedLeaseClaim` custom resources (the crate
//!   `fenced-lease-api`, re-exported).
//! - [`holder`]: the side that takes a lease and carries its token (the library; `kubectl fence` is its command line).
//! - [`fence`]: the side that checks tokens at the protected resource.
//! - [`backoff`]: jittered exponential backoff, for retries.
//! - [`client`]: a Kubernetes client whose connections send at once (`TCP_NODELAY`).
//!
//! The operator (the crate `fenced-lease-operator`) and `kubectl fence` (the crate `kubectl-fence`)
//! build on this one; nothing here depends on them.
#![forbid(unsafe_code)]

pub use fenced_lease_api as api;
pub mod backoff;
pub mod client;
pub mod fence;
pub mod holder;
