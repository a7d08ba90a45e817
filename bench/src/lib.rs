//! What the benchmark programs (`src/bin/*.rs`, the binaries `bench-*`) share.
//!
//! - [`common`]: the operator as a child process whose log is kept, a watch that records when
//!   each claim is granted, process figures, the apiserver's counters, the results file;
//! - [`writers`]: writers that race a lease's grants.
//!
//! `hack/bench` runs them and turns their results into BENCHMARKS.md's tables; their dated
//! runs are under `runs/`.

pub mod common;
pub mod writers;
