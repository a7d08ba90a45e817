//! `bench-peers`' parts: the candidates it runs itself as ([`candidate`]), the configurations
//! measured ([`configs`]), a candidate's process ([`process`]), and the three figures of each
//! configuration ([`measure`]).

mod candidate;
mod configs;
mod measure;
mod process;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

pub use candidate::run_candidate;
use configs::{Config, configs};
use measure::{Bench, Figures};

use crate::Res;
use crate::cluster::{cleanup, client, namespace};
use crate::figures::Results;
use crate::grants::{Grants, failure_report};
use crate::operator::Operator;

#[derive(Parser)]
pub struct Args {
    #[command(subcommand)]
    pub candidate: Option<Candidate>,
    /// The operator binary (for fenced-lease).
    #[arg(long, default_value = "target/release/fenced-lease-operator")]
    operator: PathBuf,
    /// The kubectl-fence binary.
    #[arg(long, default_value = "target/release/kubectl-fence")]
    kubectl_fence: PathBuf,
    /// The client-go leader-election candidate (hack/bench-leaderelection prints its path).
    #[arg(long)]
    leaderelection: Option<PathBuf>,
    /// The Go library's fenced leader-election candidate (go/examples/bench-candidate).
    #[arg(long)]
    go_candidate: Option<PathBuf>,
    /// Samples of each figure when one takes a second or two.
    #[arg(long, default_value_t = 20)]
    samples: usize,
    /// Samples of each figure when one takes a lease duration of 15 s or more.
    #[arg(long, default_value_t = 5)]
    slow_samples: usize,
    /// Rounds to spread the samples over: each round measures every configuration in turn, so
    /// that what the machine does meanwhile falls on all of them alike.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Only the configurations whose name contains one of these (comma-separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Directory for the operator's log.
    #[arg(long, default_value = "/tmp/fenced-lease-bench")]
    log_dir: PathBuf,
    /// Append result rows here (tab-separated; hack/bench renders them).
    #[arg(long)]
    results: Option<PathBuf>,
}

/// The lease a candidate takes (a FencedLease, or a Lease for kube-lease-manager), and as whom.
#[derive(clap::Args)]
pub struct Target {
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    lease: String,
    #[arg(long)]
    identity: String,
}

/// A candidate process (the bench runs itself as one).
#[derive(Subcommand)]
pub enum Candidate {
    /// Takes a FencedLease with the fenced-lease library; SIGTERM releases it.
    Fenced(Target),
    /// The floor: creates a claim, then writes its grant into the lease's status itself, as
    /// the operator would (no watch, no operator); SIGTERM ends it.
    Floor(Target),
    /// Takes a coordination.k8s.io Lease with kube-lease-manager; SIGTERM releases it.
    Klm {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        duration: u64,
        #[arg(long)]
        grace: u64,
    },
}

/// `total` samples spread over `rounds`: this round's share (the first rounds take the rest).
fn share(total: usize, rounds: usize, round: usize) -> usize {
    total / rounds + usize::from(round < total % rounds)
}

/// Every configuration chosen, round after round; then their figures.
pub async fn run(args: Args) -> Res<()> {
    let client = client().await?;
    let ns = namespace(&client, "peers").await?;
    let floor_ns = namespace(&client, "peers-floor").await?;
    let _ = std::fs::create_dir_all(&args.log_dir);
    let log = args.log_dir.join(format!("peers-{ns}.log"));
    let mut operator = Operator::start(&args.operator, Some(&ns), &ns, &log, "info")?;
    println!(
        "namespace {ns}; operator pid {} (log {})",
        operator.pid,
        log.display()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let results = Results::new(args.results.clone());
    let bench = Bench {
        args,
        client: client.clone(),
        ns: ns.clone(),
        floor_ns: floor_ns.clone(),
        results,
    };
    let chosen: Vec<(usize, Config)> = configs()
        .into_iter()
        .enumerate()
        .filter(|(_, config)| bench.chosen(config))
        .collect();
    let outcome = rounds(&bench, &chosen, &operator).await;
    operator.stop();
    println!("{}", operator.log_summary());
    cleanup(&client, &ns).await;
    cleanup(&client, &floor_ns).await;
    outcome
}

/// `--rounds` rounds, each measuring every configuration of `chosen` in turn; their figures
/// reported once all went through. Stops at the first failure, with the operator's state.
async fn rounds(bench: &Bench, chosen: &[(usize, Config)], operator: &Operator) -> Res<()> {
    let started = Instant::now();
    let mut figures: Vec<Figures> = chosen.iter().map(|_| Figures::default()).collect();
    let rounds = bench.args.rounds.max(1);
    for round in 0..rounds {
        let n = share(bench.args.samples, rounds, round);
        let n_slow = share(bench.args.slow_samples, rounds, round);
        for ((index, config), into) in chosen.iter().zip(figures.iter_mut()) {
            println!(
                "-- round {}/{rounds}: {} ({:.0} s so far)",
                round + 1,
                config.name,
                started.elapsed().as_secs_f64()
            );
            let measured = bench.measure(config, *index, round, n, n_slow, into).await;
            if let Err(e) = measured {
                println!("FAILED: {}: {e}", config.name);
                let grants = Grants::default();
                let namespaces = [bench.ns.as_str()];
                let report = failure_report(&bench.client, operator, &namespaces, &grants).await;
                println!("{report}");
                return Err(e);
            }
        }
    }
    for ((_, config), figures) in chosen.iter().zip(&figures) {
        bench.report(config, figures);
    }
    Ok(())
}
