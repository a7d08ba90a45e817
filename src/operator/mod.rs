//! The operator: grants leases FIFO, issues fencing tokens, expires silent holders, releases
//! deleted ones, and annotates holder pods. Pure decisions live in [`token`] (and, as the
//! operator grows, beside it); the reconcilers only gather state, decide, and write.

pub mod token;
