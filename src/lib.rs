//! fenced-lease: mutual exclusion on Kubernetes with a fencing token.
//!
//! A lease alone cannot give mutual exclusion: it expires, and a stalled holder does not know
//! it has. Each grant therefore carries a fencing token that only grows, and the protected
//! resource refuses any write carrying a token lower than the highest it has accepted.
//!
//! - [`api`]: the `FencedLease` and `FencedLeaseClaim` custom resources.
//! - [`operator`]: the controller that grants, expires and releases leases and issues tokens.
//! - [`holder`]: the side that takes a lease and carries its token (library, CLI).
//! - [`fence`]: the side that checks tokens at the protected resource.
//! - [`backoff`]: jittered exponential backoff, for retries.
//! - [`client`]: a Kubernetes client whose connections send at once (`TCP_NODELAY`).
#![forbid(unsafe_code)]

pub mod api;
pub mod backoff;
pub mod client;
pub mod fence;
pub mod holder;
pub mod operator;
