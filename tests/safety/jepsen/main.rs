//! A Jepsen-style safety suite: holders (the Rust library, `kubectl fence run` around a small
//! writer, and the Go library: `go/internal/cmd/jepsenholder`, through package lease and through
//! package lock with client-go's elector), each process a pod of its own, contend on short
//! leases; and client-go leaders of a coordination Lease that lease `f` follows
//! (`jepsenholder -mode=follow`) write while client-go says they lead. They write their tokens
//! to a Kubernetes object, a PostgreSQL row and a Redis key, and (all but the Go library's
//! holders) write unstamped — status, scale, patches, deletes, through the client and plain
//! `kubectl` — to a workload their lease fences by kind,
//! which only the writer's pod identity fences (I11). Meanwhile a nemesis pauses and kills
//! holders, kills, pauses and partitions the operator replicas, restarts the apiserver and
//! etcd, deletes and re-creates leases (once with their finalizer stripped) and the operator's
//! token records, lowers durations of held leases, and edits fences to invalid values. A
//! collateral writer meanwhile writes what no lease fences, as cluster-admin and as a pod that
//! holds nothing, which nothing may refuse (I12: [`collateral`]). Every event is recorded with
//! a CLOCK_MONOTONIC timestamp; a checker over the whole history reports the first violation
//! and prints a table.
//!
//! ```console
//! $ cargo test --all-features --test jepsen                       # the short profile (make test)
//! $ cargo test --all-features --test jepsen -- --profile long --seed 7 --duration 20m   # make soak
//! $ cargo test --all-features --test jepsen -- --check /tmp/fenced-lease-jepsen-7-1234  # re-check a kept history
//! ```
//!
//! The binary has no libtest harness: it runs itself again as the holder processes
//! (`JEPSEN_ROLE`). The checker's own tests are in `tests/offline/jepsen_checker/`.

extern crate fenced_lease_tests as common;

mod checker;
mod cluster;
mod collateral;
mod history;
mod nemesis;
mod pods;
mod run;
mod stale;
mod step_downs;
mod worker;
mod workload;
mod writes;

use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    if let Ok(role) = std::env::var("JEPSEN_ROLE") {
        return worker::main(&role);
    }
    let options = match run::Options::parse(std::env::args().skip(1)) {
        Ok(Some(options)) => options,
        Ok(None) => return ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("jepsen: {message}\n\n{}", run::USAGE);
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let passed = runtime.block_on(run::main(options));
    runtime.shutdown_timeout(Duration::from_secs(5));
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
