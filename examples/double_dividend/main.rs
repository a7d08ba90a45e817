//! `make demo`: the "double dividend". Two workers contend for one FencedLease to pay account
//! 42's dividend exactly once. Worker A takes the lease and starts paying; it is paused
//! (SIGSTOP, a stop-the-world pause) past its lease; B is granted the next token, finds the
//! dividend unpaid and pays it; A resumes, still believing it holds the lease, and writes with
//! its old token. Its writes are refused by the apiserver (ConfigMaps fenced by the admission
//! policies: its token is too old, and its pod no longer holds the lease — a plain delete is
//! refused too) and by PostgreSQL (a fenced row). Each worker runs as its own pod's identity (a
//! ServiceAccount token bound to the pod, as every pod mounts). Prints the timeline; exits 0
//! only if every stale write was refused and the dividend was paid once.
//!
//! Run by `hack/demo` (which starts the control plane, PostgreSQL and the operator); by hand:
//!
//! ```console
//! $ cargo run --all-features --example double-dividend -- --namespace demo
//! ```
//! with KUBECONFIG, FL_POSTGRES_URL, the CRDs, deploy/admission and an operator watching
//! `demo` in place. A worker is this program run with `--worker NAME`.
//!
//! `worker.rs` is what a worker does, `demo.rs` the scenario around it, `launch.rs` how the
//! demo runs a worker (a process, or a pod on a node).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use serde::{Deserialize, Serialize};

mod demo;
mod launch;
mod worker;

type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

const LEASE: &str = "dividend-42";
const LEASE_SECONDS: u64 = 3;
/// How long paying takes: the pause hits in the middle of it.
const PAYING: Duration = Duration::from_millis(2000);
/// How long paying takes in a pod: its report reaches the demo through the kubelet's log
/// stream, which can be seconds late on a busy node (2.6 s seen, when the pause came after the
/// 2 s payment had ended), so the payment lasts long enough for the pause to land in it.
const PAYING_IN_A_POD: Duration = Duration::from_secs(10);
/// The ServiceAccount the workers' pods run as.
const WORKER_ACCOUNT: &str = "dividend-worker";
/// The payout ConfigMap.
const PAYOUT: &str = "dividend-42-2024q4";

/// The double dividend: a stalled lease holder whose writes are fenced out.
#[derive(Parser)]
struct Args {
    /// Namespace of the lease and the ConfigMaps (an operator must watch it).
    #[arg(short = 'n', long)]
    namespace: String,
    /// Where the workers' logs go.
    #[arg(long, default_value = "/tmp")]
    log_dir: PathBuf,
    /// Run the workers as pods of IMAGE on a node (hack/node), paused by freezing their cgroup:
    /// run as root on the node's machine. Without it, workers are processes holding tokens of
    /// pods no kubelet runs, paused by SIGSTOP.
    #[arg(long, value_name = "IMAGE")]
    pods: Option<String>,
    /// PostgreSQL as the workers' pods reach it (default: FL_POSTGRES_URL).
    #[arg(long, value_name = "URL", requires = "pods")]
    pods_postgres_url: Option<String>,
    /// Run as worker NAME (used by the demo itself).
    #[arg(long, hide = true)]
    worker: Option<String>,
    /// The PostgreSQL table of the ledger (workers only).
    #[arg(long, hide = true)]
    table: Option<String>,
    /// Start of the timeline, ms since the epoch (workers only).
    #[arg(long, hide = true)]
    t0_ms: Option<u128>,
    /// How long paying takes, ms (workers only; default 2000).
    #[arg(long, hide = true)]
    paying_ms: Option<u64>,
}

/// One line a worker reports to the demo, as JSON on its stdout.
#[derive(Serialize, Deserialize, Debug)]
struct Report {
    at_ms: u128,
    event: Event,
    text: String,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Event {
    Granted,
    Paying,
    Accepted,
    Refused,
    Failed,
    Done,
}

fn epoch_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let result = match args.worker.clone() {
        Some(name) => worker::worker(&args, &name).await,
        None => demo::demo(&args).await,
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("double-dividend: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn postgres() -> Result<tokio_postgres::Client> {
    let url = std::env::var("FL_POSTGRES_URL").map_err(|_| "FL_POSTGRES_URL is not set")?;
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// Waits until `check` answers true, every 50 ms; fails after `timeout`.
async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        if Instant::now() > deadline {
            return Err(format!("timed out after {timeout:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// ConfigMap `name`: account 42's Q4 dividend, paid by `paid_by`.
fn config_map(name: &str, paid_by: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            ("account".into(), "42".into()),
            ("dividend".into(), "2024-Q4".into()),
            ("paidBy".into(), paid_by.into()),
        ])),
        ..Default::default()
    }
}
