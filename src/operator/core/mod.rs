//! What to do, decided without I/O: who holds next and why a holder stops ([`decide`]; for a
//! lease that follows a coordination Lease, [`follow`]), the next token ([`token`]), the statuses a decision implies ([`status`]), the next step of
//! writing a lease's status ([`step`]), which waiting claims need no new status ([`unchanged`]),
//! and what to report of a transition ([`transitions`]).

pub mod decide;
pub mod follow;
pub mod status;
pub mod step;
pub mod token;
pub mod transitions;
pub mod unchanged;
