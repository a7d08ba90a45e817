//! The benchmark programs' library. Each program is a binary, `src/bin/<name>.rs`
//! (`bench-<name>`), whose doc says what it measures and how to run it; `hack/bench` runs them
//! and turns their results into BENCHMARKS.md's tables, and their dated runs are under `runs/`.
//!
//! The longer programs keep their steps here, a module each, their flags (`Args`) and `run` in
//! the folder's `mod.rs`:
//! - [`admission`]: the fence's admission objects at 0, 1,000 and 10,000 leases;
//! - [`fence`]: the lease rules' windows after a grant, guarded datastore writes;
//! - [`peers`]: acquire, hand-over and failover beside kube-lease-manager and client-go;
//! - [`scale`]: the operator at 1,000 to 10,000 leases;
//! - [`throughput`]: rates of writes, grants and hand-overs.
//!
//! What the programs share:
//! - [`cluster`]: the kubeconfig's client, calls with a deadline, namespaces, bulk creates;
//! - [`objects`]: leases, claims and pods as the programs create them, a holder's heartbeat;
//! - [`operator`]: the operator as a child process whose log is kept;
//! - [`grants`]: a watch that records when each claim is granted, and the failure report;
//! - [`apiserver`]: the apiserver's own write counters;
//! - [`procfs`]: process and TCP figures from /proc;
//! - [`figures`]: median, p99 and worst, printed and appended to the results file;
//! - [`pod_client`]: a client acting as a pod, with a ServiceAccount token bound to it;
//! - [`writers`]: writer pods that race a lease's grants;
//! - [`datastores`]: `hack/datastores`' PostgreSQL and Redis.

#![forbid(unsafe_code)]

pub mod admission;
pub mod apiserver;
pub mod cluster;
pub mod datastores;
pub mod fence;
pub mod figures;
pub mod grants;
pub mod objects;
pub mod operator;
pub mod peers;
pub mod pod_client;
pub mod procfs;
pub mod scale;
pub mod throughput;
pub mod writers;

pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Fails with `message` (for `?` in the programs).
pub fn fail<T>(message: impl Into<String>) -> Res<T> {
    Err(message.into().into())
}
