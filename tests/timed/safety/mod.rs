//! What the safety suite found, and the operator's own faults.

mod found_by_jepsen;
mod operator_faults;
