//! `fenced-lease-operator`: grants FencedLeases to their claims and issues fencing tokens.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use fenced_lease_operator::metrics::Metrics;
use fenced_lease_operator::runtime::http::{self, Health};
use fenced_lease_operator::runtime::leader::{Election, Leadership};
use fenced_lease_operator::runtime::run::{self, Settings};
use kube::{Client, Config};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

/// Kubernetes operator that hands out FencedLeases: FIFO grants, fencing tokens that only
/// grow, expiry of holders whose heartbeat stops, and the token on the holder's pod.
#[derive(Parser, Debug)]
#[command(
    version,
    after_help = "Examples:\n  fenced-lease-operator                       # all namespaces, leader election on\n  fenced-lease-operator -n team-a --leader-election=false --log-format text\n  fenced-lease-operator -n team-a -n team-b   # two namespaces (or -n team-a,team-b)\n\nLog level: RUST_LOG (default info), e.g. RUST_LOG=fenced_lease=debug."
)]
struct Args {
    /// Serve only these namespaces (repeat the flag, or separate them with commas; default:
    /// every namespace). Each is watched on its own: the operator needs no cluster-wide read.
    #[arg(
        short,
        long = "namespace",
        env = "FENCED_LEASE_NAMESPACE",
        value_name = "NAMESPACE",
        value_delimiter = ',',
        value_parser = namespace_name
    )]
    namespaces: Vec<String>,

    /// Address of /metrics, /livez and /readyz.
    #[arg(
        long,
        env = "FENCED_LEASE_METRICS_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    metrics_addr: SocketAddr,

    /// Log format.
    #[arg(
        long,
        env = "FENCED_LEASE_LOG_FORMAT",
        value_enum,
        default_value = "json"
    )]
    log_format: LogFormat,

    /// Elect one active replica among several (turn off only when running one replica).
    #[arg(long, env = "FENCED_LEASE_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,

    /// The operator's own namespace: its leader-election Lease and the ConfigMaps
    /// `fenced-lease-tokens.<namespace>` that keep tokens growing across deletion of a lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    operator_namespace: String,

    /// Name of the leader-election Lease.
    #[arg(long, default_value = "fenced-lease-operator")]
    leader_election_name: String,

    /// Seconds a standby waits, after the leader's last renewal, before taking over.
    #[arg(long, default_value_t = 15)]
    leader_election_lease_seconds: u64,

    /// This replica's name in Events and in the leader Lease (default: POD_NAME, else hostname).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,

    /// Deadline of every Kubernetes API call, e.g. 10s.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    api_timeout: Duration,

    /// Also reconcile every lease at this interval, as a safety net.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    resync: Duration,

    /// Normal Events (grants, releases) published per second at most, after a burst of ten
    /// seconds' worth; the rest are counted in fenced_lease_events_skipped_total. Warnings are
    /// never held back. 0: no Normal Events.
    #[arg(long, default_value_t = 5.0)]
    events_per_second: f64,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (examples: 10s, 500ms, 5m)"))
}

fn init_tracing(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none());
    match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
        LogFormat::Text => builder.init(),
    }
}

fn identity(args: &Args) -> String {
    args.identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("fenced-lease-operator-{}", std::process::id()))
}

/// A namespace's name (an RFC 1123 label), so that `-n a,` or a typo fails at start, naming
/// it, rather than as a watch that retries for good.
fn namespace_name(name: &str) -> Result<String, String> {
    let valid = (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "{name:?} is not a namespace name (1-63 lowercase letters, digits and '-', starting and ending with a letter or digit)"
        ))
    }
}

/// The namespaces to serve, each once, in the order given.
fn served(mut namespaces: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    namespaces.retain(|ns| seen.insert(ns.clone()));
    namespaces
}

fn main() -> ExitCode {
    tune_malloc();
    let mut args = Args::parse();
    args.namespaces = served(args.namespaces);
    init_tracing(args.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.spawn(trim_malloc());
    match runtime.block_on(run(args)) {
        Ok(code) => code,
        Err(message) => {
            error!(error = %message, "fenced-lease-operator failed");
            ExitCode::FAILURE
        }
    }
}

/// Hands the free pages inside glibc's heaps back to the kernel now and then. Objects replaced
/// by their next version (every grant replaces a lease and a claim) leave holes that free()
/// keeps; trimming them costs a few milliseconds every 15 s.
async fn trim_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    loop {
        tokio::time::sleep(Duration::from_secs(15)).await;
        // SAFETY: malloc_trim only releases memory malloc holds free.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// glibc's malloc, left to its defaults, keeps the operator's resident memory well above what
/// it uses: a heap arena per thread that ever allocated, and freed buffers (the pages of a
/// 10,000-object list, say) kept for reuse, since the threshold above which a buffer gets its
/// own mapping rises to the largest one freed. So: two arenas and a fixed 128 KiB threshold
/// for mapping and trimming (measured in bench/runs/2026-11-30-pods). Set before any thread
/// starts; each setting the environment
/// already gives (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`) is
/// left to it.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (env, param, value) in [
        ("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, 2),
        ("MALLOC_MMAP_THRESHOLD_", libc::M_MMAP_THRESHOLD, 128 * 1024),
        ("MALLOC_TRIM_THRESHOLD_", libc::M_TRIM_THRESHOLD, 128 * 1024),
    ] {
        if std::env::var_os(env).is_none() {
            // SAFETY: mallopt only changes allocator parameters; called before any other thread
            // exists.
            unsafe {
                libc::mallopt(param, value);
            }
        }
    }
}

/// Waits until this replica leads (`None`: stopped first). Standbys are ready meanwhile: they
/// serve health and wait; only the leader's caches matter.
async fn lead(
    args: &Args,
    client: &Client,
    identity: &str,
    ready: &AtomicBool,
    stop: &CancellationToken,
) -> Option<Leadership> {
    let lease_duration = Duration::from_secs(args.leader_election_lease_seconds.max(3));
    let election = Election {
        namespace: args.operator_namespace.clone(),
        name: args.leader_election_name.clone(),
        identity: identity.to_string(),
        lease_duration,
        renew_deadline: lease_duration * 2 / 3,
        retry_period: lease_duration / 7,
        api_timeout: args.api_timeout,
    };
    ready.store(true, Ordering::Release);
    info!(identity = %identity, lease = %election.name, namespace = %election.namespace, "waiting for leadership");
    let leadership = loop {
        match election.lead(client, stop).await {
            Ok(Some(leadership)) => break leadership,
            Ok(None) => return None,
            Err(e) => error!(error = %e, "leader election failed; retrying"),
        }
    };
    ready.store(false, Ordering::Release);
    Some(leadership)
}

async fn run(args: Args) -> Result<ExitCode, String> {
    let mut config = Config::infer()
        .await
        .map_err(|e| format!("no Kubernetes configuration: {e}"))?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = None; // watches stream; each call has its own deadline instead
    let client = fenced_lease::client::client(config)
        .map_err(|e| format!("cannot build a Kubernetes client: {e}"))?;

    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        info!("shutting down");
        on_signal.cancel();
    });

    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));
    let health = Health {
        ready: ready.clone(),
        metrics: metrics.clone(),
    };
    let server = http::serve(args.metrics_addr, health, stop.clone())
        .await
        .map_err(|e| format!("cannot serve metrics on {}: {e}", args.metrics_addr))?;

    // Every replica counts the refusals holders report, standbys too: a hand-over does not
    // lose the ones reported meanwhile (the alert takes the highest count of any replica).
    fenced_lease_operator::refusals::start(&client, &args.namespaces, metrics.clone(), &stop);

    let identity = identity(&args);
    let settings = Settings {
        namespaces: args.namespaces.clone(),
        api_timeout: args.api_timeout,
        state_namespace: args.operator_namespace.clone(),
        instance: Some(identity.clone()),
        resync: args.resync,
        events_per_second: args.events_per_second,
    };

    let controllers_stop = stop.child_token();
    let lost_leadership = if args.leader_election {
        let Some(leadership) = lead(&args, &client, &identity, &ready, &stop).await else {
            return finish(server).await;
        };
        let lost = leadership.lost.clone();
        metrics.leader.set(1);
        let leading = metrics.clone();
        let lost_leadership = tokio::select! {
            () = run::run(client, settings, metrics, ready, controllers_stop.clone()) => false,
            // Deposed: the controllers and their in-flight reconciles are dropped at once,
            // not drained, so nothing more is written once another replica may lead.
            () = lost.cancelled() => true,
        };
        leading.leader.set(0);
        controllers_stop.cancel();
        stop.cancel();
        // The controllers have stopped: hand the Lease back so a standby takes over at once.
        leadership.release.cancel();
        let _ = tokio::time::timeout(args.api_timeout, leadership.renewal).await;
        lost_leadership
    } else {
        // The only replica: it leads.
        metrics.leader.set(1);
        run::run(client, settings, metrics, ready, controllers_stop).await;
        false
    };
    stop.cancel();
    let code = finish(server).await?;
    if lost_leadership {
        // Restart (by the Deployment) as a standby with fresh state.
        return Err("lost leadership".into());
    }
    Ok(code)
}

async fn finish(server: tokio::task::JoinHandle<std::io::Result<()>>) -> Result<ExitCode, String> {
    match server.await {
        Ok(Ok(())) => Ok(ExitCode::SUCCESS),
        Ok(Err(e)) => Err(format!("metrics server: {e}")),
        Err(e) => Err(format!("metrics server task: {e}")),
    }
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            error!(error = %e, "cannot listen for SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_repeat_or_split_on_commas_and_a_bad_one_is_refused_by_name() {
        let args =
            Args::try_parse_from(["op", "-n", "a", "--namespace", "b,c", "-n", "a"]).unwrap();
        assert_eq!(served(args.namespaces), ["a", "b", "c"]);
        let args = Args::try_parse_from(["op"]).unwrap();
        assert!(args.namespaces.is_empty(), "none given: every namespace");
        for bad in ["a,", "Team-A", "a-", "a_b"] {
            let error = Args::try_parse_from(["op", "-n", bad])
                .unwrap_err()
                .to_string();
            assert!(error.contains("is not a namespace name"), "{bad}: {error}");
        }
    }
}
