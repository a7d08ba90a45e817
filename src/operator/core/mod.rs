//! What to do, decided without I/O: who holds next and why a holder stops ([`decide`]), the
//! next token ([`token`]), the statuses a decision implies ([`status`]), the next step of
//! writing a lease's status ([`step`]), which waiting claims need no new status ([`unchanged`]),
//! what to report of a transition ([`transitions`]), and
//! the bindings that fence a lease's objects ([`fence`]) and the policies of its kinds
//! ([`fence_policy`]).

pub mod decide;
pub mod fence;
pub mod fence_policy;
pub mod status;
pub mod step;
pub mod token;
pub mod transitions;
pub mod unchanged;
