//! `bench-throughput`'s measurements, one module each: the apiserver's raw write rate
//! ([`raw`]), grants at steady create rates ([`rates`]), hand-overs on one lease
//! ([`handovers`]), and the writes a heartbeat costs ([`heartbeats`]).

mod handovers;
mod heartbeats;
mod rates;
mod raw;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::Res;
use crate::cluster::{cleanup, client, namespace};
use crate::figures::Results;
use crate::grants::{Grants, failure_report};
use crate::operator::Operator;

#[derive(Parser)]
pub struct Args {
    /// The operator binary to measure.
    #[arg(long, default_value = "target/release/fenced-lease-operator")]
    operator: PathBuf,
    /// Requests in flight for the apiserver's raw write rate (one figure each).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    raw_concurrency: Vec<usize>,
    /// Seconds of each raw write-rate measurement.
    #[arg(long, default_value_t = 5)]
    raw_seconds: u64,
    /// Claims created per second (one figure each), each on its own free lease.
    #[arg(long, value_delimiter = ',', default_value = "20,100")]
    rates: Vec<f64>,
    /// Seconds of each steady-rate measurement.
    #[arg(long, default_value_t = 5)]
    rate_seconds: u64,
    /// Hand-overs measured on one lease.
    #[arg(long, default_value_t = 100)]
    handovers: usize,
    /// Also measure the first `--handovers` hand-overs of a queue this long (0: not).
    #[arg(long, default_value_t = 0)]
    deep_queue: usize,
    /// Heartbeats on one held claim, for the writes each costs.
    #[arg(long, default_value_t = 20)]
    beats: usize,
    /// Directory for the operator's log.
    #[arg(long, default_value = "/tmp/fenced-lease-bench")]
    log_dir: PathBuf,
    /// Append result rows here (tab-separated; hack/bench renders them).
    #[arg(long)]
    results: Option<PathBuf>,
}

/// Every measurement in turn: the apiserver alone, then the operator's.
pub async fn run(args: Args) -> Res<()> {
    let client = client().await?;
    let results = Results::new(args.results.clone());
    let _ = std::fs::create_dir_all(&args.log_dir);

    // The apiserver alone: status patches of FencedLeases no operator watches.
    let raw_ns = namespace(&client, "raw").await?;
    raw::raw_writes(&client, &args, &results, &raw_ns).await?;
    cleanup(&client, &raw_ns).await;

    let ns = namespace(&client, "rates").await?;
    let log = args.log_dir.join(format!("throughput-{ns}.log"));
    let mut operator = Operator::start(&args.operator, Some(&ns), &ns, &log, "info")?;
    println!(
        "namespace {ns}; operator pid {} (log {})",
        operator.pid,
        log.display()
    );
    let grants = Grants::watch(&client, Some(&ns));
    grants.synced().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let outcome = async {
        rates::steady_rates(&client, &args, &results, &ns, &grants).await?;
        handovers::handovers(&client, &args, &results, &ns, &grants).await?;
        heartbeats::heartbeat_writes(&client, &args, &results, &ns, &grants).await
    }
    .await;
    if let Err(e) = &outcome {
        println!("FAILED: {e}");
        println!(
            "{}",
            failure_report(&client, &operator, &[&ns], &grants).await
        );
    }
    operator.stop();
    println!("{}", operator.log_summary());
    cleanup(&client, &ns).await;
    outcome
}
