//! Rates: the apiserver's own write rate on this machine (the ceiling of everything else),
//! grants per second at a steady create rate, hand-overs per second on one lease, and how
//! many apiserver writes a grant and a heartbeat cost (the apiserver's
//! `apiserver_request_total`, read with the admin kubeconfig). One module each in
//! `src/throughput/`.
//!
//! ```console
//! $ eval "$(hack/control-plane up)"
//! $ cargo build --release --bin fenced-lease-operator
//! $ cargo run --release --bin bench-throughput -- --operator target/release/fenced-lease-operator
//! ```

use clap::Parser;
use fenced_lease_bench::throughput::{Args, run};

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("bench_throughput: {e}");
        std::process::exit(1);
    }
}
