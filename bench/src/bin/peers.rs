//! Side by side, against the same control plane: how long until a candidate holds a free
//! lease (acquire), holds a lease another holder has just released (hand-over), and holds a
//! lease whose holder was SIGKILLed (failover, minus the lease duration), for
//!
//! - fenced-lease: the library (`fenced_lease::holder::acquire`), `kubectl fence run`, and the
//!   Go library's two election paths (`go/examples/bench-candidate`): its own elector (package
//!   `election`) and client-go's elector on the FencedLease lock (package `lock`, as
//!   controller-runtime's manager uses it);
//! - kube-lease-manager (the Rust crate) on a coordination.k8s.io Lease;
//! - client-go's `tools/leaderelection` (`bench/leaderelection`, built by
//!   `hack/bench-leaderelection`) on a coordination.k8s.io Lease;
//!
//! each with its default timings and with the fastest it allows; and, for the acquire only, the
//! floor of a token the server issues: one process that creates a claim and then writes its
//! grant into the lease's status itself, back to back, in a namespace no operator serves. A
//! fenced-lease acquire minus the floor is what the watches and the operator add to the two
//! writes.
//!
//! Every candidate is its own process, so a SIGKILL is a real one; each prints
//! `leading <unix ns>` when it holds, and the figures are that stamp minus the wall-clock
//! instant the bench acted. Its parts are modules of `src/peers/`.
//!
//! ```console
//! $ eval "$(hack/control-plane up)"
//! $ cargo build --release --bin fenced-lease-operator --bin kubectl-fence
//! $ (cd go && go build -o /tmp/bench-candidate ./examples/bench-candidate)
//! $ cargo run --release --bin bench-peers -- --leaderelection "$(hack/bench-leaderelection)" \
//!     --go-candidate /tmp/bench-candidate
//! ```

use clap::Parser;
use fenced_lease_bench::peers::{Args, run, run_candidate};

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Some(candidate) = args.candidate {
        if let Err(e) = run_candidate(candidate).await {
            eprintln!("candidate: {e}");
            std::process::exit(1);
        }
        return;
    }
    if let Err(e) = run(args).await {
        eprintln!("bench_peers: {e}");
        std::process::exit(1);
    }
}
