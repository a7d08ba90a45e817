//! What to do, decided without I/O: who holds next and why a holder stops ([`decide`]; for a
//! lease that follows a coordination Lease, [`follow`]), the next token ([`token`]), the
//! statuses a decision implies (the lease's, [`status`]; its claims', [`claim_status`]), one
//! round of deciding a lease's status on what is known so far ([`round`]), the next step of
//! writing it ([`step`]), and what to report of a transition ([`transitions`]).

pub mod claim_status;
pub mod decide;
pub mod follow;
pub mod round;
pub mod status;
pub mod step;
pub mod token;
pub mod transitions;
