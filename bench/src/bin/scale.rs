//! The operator at scale, one size after another (default 1,000, 5,000 and 10,000 leases):
//!
//! 1. N leases, each with one waiting claim, are created while no operator runs (an outage);
//! 2. the operator starts over them: how fast does it grant them all (grants/s), and does a
//!    fresh claim in another namespace get its grant meanwhile? If no claim is granted for
//!    `--stall` seconds, or all are not granted within `--grant-timeout`, the program fails
//!    and prints the operator's state (claims by phase, its metrics, its log's warnings) and
//!    where its log is;
//! 3. with every lease held, the holders heartbeat at `--beat-rate`: operator CPU seconds per
//!    1,000 heartbeats, resident memory, apiserver writes per second and per heartbeat
//!    (the apiserver's `apiserver_request_total`), and how late expiries fire meanwhile;
//! 4. every lease and claim is deleted, 32 at a time, the operator running: how fast are the
//!    leases finalized, and does a new claim in another namespace get its grant meanwhile?
//!    Fails when no lease goes for 60 s.
//!
//! One module per step in `src/scale/`.
//!
//! ```console
//! $ eval "$(hack/control-plane up)"
//! $ cargo build --release --bin fenced-lease-operator
//! $ cargo run --release --bin bench-scale -- --sizes 1000 --operator target/release/fenced-lease-operator
//! ```

use clap::Parser;
use fenced_lease_bench::scale::{Args, run};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    run(Args::parse()).await
}
