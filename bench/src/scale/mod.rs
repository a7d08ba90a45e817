//! `bench-scale`'s steps, one module each: the leases created in an outage ([`outage`]), the
//! operator started over them ([`start`]), heartbeats ([`heartbeats`]) with expiries meanwhile
//! ([`expiry`]), every lease deleted at once ([`deletion`]); or, with `--live`, leases created
//! one by one while the operator runs ([`live`]).

mod deletion;
mod expiry;
mod heartbeats;
mod live;
mod outage;
mod start;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use kube::Client;

use crate::Res;
use crate::cluster::{cleanup, client, namespace};
use crate::figures::Results;

/// The section of the results.
const SECTION: &str = "scale";
/// The system of the results.
const SYSTEM: &str = "fenced-lease";

/// The operator at 1,000 / 5,000 / 10,000 leases: grants after an outage, heartbeats, expiry.
#[derive(Parser)]
pub struct Args {
    /// The operator binary to measure.
    #[arg(long, default_value = "target/release/fenced-lease-operator")]
    operator: PathBuf,
    /// Numbers of leases (each with one claim), one profile each.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000")]
    sizes: Vec<usize>,
    /// Repeat each size this many times.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Fail when no claim was granted for this long while some still wait (seconds).
    #[arg(long, default_value_t = 60)]
    stall: u64,
    /// Fail when not every claim is granted within this long after the start (seconds).
    #[arg(long, default_value_t = 600)]
    grant_timeout: u64,
    /// Heartbeats per second across all holders (about half the apiserver's raw write rate
    /// leaves room for the operator's own writes).
    #[arg(long, default_value_t = 100.0)]
    beat_rate: f64,
    /// Seconds of the heartbeat window the figures are taken over.
    #[arg(long, default_value_t = 30)]
    beat_seconds: u64,
    /// Leases whose holder stops heartbeating, for the expiry lateness (lease duration 2 s);
    /// created first, then their holders queued 50 ms apart, each with a waiter behind it, so
    /// their expiries come one at a time, as independent holders' do.
    #[arg(long, default_value_t = 100)]
    expiries: usize,
    /// Requests in flight while creating objects and heartbeating.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// The operator's RUST_LOG.
    #[arg(long, default_value = "info")]
    rust_log: String,
    /// Directory for the operator's logs.
    #[arg(long, default_value = "/tmp/fenced-lease-bench")]
    log_dir: PathBuf,
    /// Append result rows here (tab-separated; hack/bench renders them).
    #[arg(long)]
    results: Option<PathBuf>,
    /// Leave the namespaces in place (for a look at them afterwards).
    #[arg(long)]
    keep: bool,
    /// Give every claim a pod of its own, created with the leases (a Deployment's labels; no
    /// kubelet runs them), and have the leases annotate their holder's pod, as for holders
    /// in pods: the operator then caches N pods too and writes each holder's token annotation.
    #[arg(long)]
    pods: bool,
    /// Instead: create each lease and then its claim, one after the other, while the
    /// operator runs (as a growing user does); only the grants and memory are measured.
    #[arg(long)]
    live: bool,
}

/// Every size, `--repeat` times; the exit status is 1 when a profile failed.
pub async fn run(args: Args) -> std::process::ExitCode {
    let results = Results::new(args.results.clone());
    let client = match client().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("bench_scale: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let _ = std::fs::create_dir_all(&args.log_dir);
    let mut failed = 0;
    for &n in &args.sizes {
        for run in 1..=args.repeat {
            println!("== {n} leases, run {run} of {} ==", args.repeat);
            match profile(&client, &args, &results, n, run).await {
                Ok(()) => {}
                Err(e) => {
                    failed += 1;
                    println!("FAILED: {n} leases, run {run}: {e}");
                    results.value(
                        SECTION,
                        SYSTEM,
                        &format!("N={n}: run FAILED"),
                        0.0,
                        "",
                        e.to_string().lines().next().unwrap_or(""),
                    );
                }
            }
        }
    }
    if failed > 0 {
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}

/// One profile: what every step needs.
struct Profile<'a> {
    client: &'a Client,
    args: &'a Args,
    results: &'a Results,
    /// Leases (each with one claim).
    n: usize,
    /// Which run of this size.
    run: usize,
    /// The leases' namespace (and the operator's records').
    ns: &'a str,
    /// Another namespace, for a probe claim granted meanwhile.
    probe_ns: &'a str,
}

impl Profile<'_> {
    /// Adds the row of one figure, named `N=<n>: <figure>`.
    fn value(&self, figure: &str, value: f64, unit: &str, note: &str) {
        let figure = format!("N={}: {figure}", self.n);
        self.results
            .value(SECTION, SYSTEM, &figure, value, unit, note);
    }
}

async fn profile(client: &Client, args: &Args, results: &Results, n: usize, run: usize) -> Res<()> {
    let ns = namespace(client, "scale").await?;
    let probe_ns = namespace(client, "probe").await?;
    let profile = Profile {
        client,
        args,
        results,
        n,
        run,
        ns: &ns,
        probe_ns: &probe_ns,
    };
    let outcome = measure(&profile).await;
    if !args.keep {
        let started = Instant::now();
        cleanup(client, &probe_ns).await;
        cleanup(client, &ns).await;
        println!(
            "cleaned up {ns} and {probe_ns} in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    outcome
}

/// The steps of one profile, in order.
async fn measure(p: &Profile<'_>) -> Res<()> {
    let names: Vec<String> = (0..p.n).map(|i| format!("l-{i}")).collect();
    if p.args.live {
        return live::live(p, &names).await;
    }
    // 1. The outage: leases and claims created while no operator runs.
    outage::create(p, &names).await?;
    // 2. The operator starts over them.
    let started = start::grant_all(p).await?;
    // 3. Heartbeats; expiry while they go on: holders that never beat, waiters that do.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let beating = heartbeats::Driver::start(p, &names);
    heartbeats::figures(p, &started.operator, &beating).await?;
    let lateness = expiry::expiries(p.client, p.ns, &started.grants, p.args.expiries).await;
    beating.stop().await;
    expiry::report(p, &started, lateness).await?;
    // 4. Every lease and claim deleted at once (as with their namespace), the operator running.
    deletion::measure(p, &started).await?;
    started.finish();
    Ok(())
}

fn print_writes(writes: &BTreeMap<String, f64>, beats: f64) {
    for (what, count) in writes {
        println!(
            "  {count:>8.0} {what:<40} {:.2} each",
            count / beats.max(1.0)
        );
    }
}
