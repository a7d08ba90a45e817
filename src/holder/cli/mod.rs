//! `kubectl fence`: the holder side from the command line. `run LEASE -- CMD` is flock(1) for
//! Kubernetes; `status`, `list`, `acquire` and `release` are for people and scripts.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::holder::Error;

mod commands;
pub mod exit;
pub mod report;
mod run;

use commands::{acquire_and_leave, acquire_options, list, release, status};

/// The exit-code table shown by `--help` (a macro, so that it can be `concat!`ed).
macro_rules! exit_codes {
    () => {
        "\
Exit codes:
  0     success (run: CMD's own code when it ran to the end while the lease was held)
  1     error (lease not found, bad kubeconfig, unexpected API error)
  2     bad command line
  69    Kubernetes API unavailable
  75    not acquired within --wait
  76    lease lost while CMD ran (CMD was sent SIGTERM, then SIGKILL after --grace)
  77    forbidden by RBAC (bind the holder Role, deploy/rbac/holder-role.yaml)
  126   CMD could not be executed
  127   CMD not found
  130   interrupted while waiting for the lease
  128+N run: CMD was ended by signal N"
    };
}

/// Fenced leases from the command line: hold a lease while a command runs, with a fencing
/// token the protected resource checks.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-fence",
    bin_name = "kubectl fence",
    version,
    after_help = "Examples:\n  kubectl fence run db-migrate --wait 5m -- ./migrate.sh\n  kubectl fence status db-migrate\n  kubectl fence list -o yaml",
    after_long_help = concat!(
        "Examples:\n  kubectl fence run db-migrate --wait 5m -- ./migrate.sh\n  kubectl fence status db-migrate\n  kubectl fence list -o yaml\n\n",
        exit_codes!()
    ),
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// kubectl-like flags, accepted before or after the command.
#[derive(Debug, Args)]
pub struct Global {
    /// Namespace (default: the kubeconfig context's, else the pod's, else "default").
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Path to the kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
}

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show a lease: holder, token, expiry and the waiting queue.
    #[command(after_help = "Example:\n  kubectl fence status db-migrate -n jobs -o json")]
    Status {
        /// The FencedLease.
        lease: String,
    },
    /// List the leases of the namespace with holder, token, waiting and expiry.
    #[command(after_help = "Example:\n  kubectl fence list -n jobs")]
    List,
    /// Wait for a lease, print its token and exit, leaving the claim in place.
    ///
    /// Nothing renews the claim after this command exits: it expires after the lease
    /// duration unless released sooner with `kubectl fence release`. To hold a lease while
    /// work runs, use `kubectl fence run`.
    #[command(
        after_help = "Example:\n  TOKEN=$(kubectl fence acquire db-migrate --wait 30s) && ./write --token \"$TOKEN\"; kubectl fence release db-migrate",
        after_long_help = concat!(
            "Example:\n  TOKEN=$(kubectl fence acquire db-migrate --wait 30s) && ./write --token \"$TOKEN\"; kubectl fence release db-migrate\n\n",
            exit_codes!()
        )
    )]
    Acquire {
        /// The FencedLease.
        lease: String,
        #[command(flatten)]
        holder: HolderArgs,
    },
    /// Release a lease: delete this identity's claims on it (or the one named).
    #[command(
        after_help = "Example:\n  kubectl fence release db-migrate\n  kubectl fence release db-migrate --claim db-migrate-x7k2p"
    )]
    Release {
        /// The FencedLease.
        lease: String,
        /// Holder identity whose claims to delete (default: $POD_NAME, else the hostname).
        #[arg(long)]
        identity: Option<String>,
        /// Delete only this claim.
        #[arg(long)]
        claim: Option<String>,
    },
    /// Hold a lease while CMD runs (flock for Kubernetes).
    ///
    /// Waits for the lease, then runs CMD with FENCE_TOKEN, FENCE_LEASE, FENCE_HOLDER,
    /// FENCE_CLAIM and FENCE_NAMESPACE in its environment, renews the lease while CMD
    /// runs, and releases it when CMD exits. CMD runs in its own process group; if the
    /// lease is lost, the group gets SIGTERM, then SIGKILL after --grace. SIGINT, SIGTERM
    /// and SIGHUP sent to kubectl fence are passed on to CMD. Send FENCE_TOKEN with every
    /// write, so the protected resource can refuse a holder that lost the lease.
    #[command(
        after_help = "Example:\n  kubectl fence run db-migrate --wait 5m -- sh -c './migrate --fence-token \"$FENCE_TOKEN\"'",
        after_long_help = concat!(
            "Example:\n  kubectl fence run db-migrate --wait 5m -- sh -c './migrate --fence-token \"$FENCE_TOKEN\"'\n\n",
            exit_codes!()
        )
    )]
    Run {
        /// The FencedLease.
        lease: String,
        #[command(flatten)]
        holder: HolderArgs,
        /// Time CMD gets to exit after SIGTERM before SIGKILL, once the lease is lost.
        #[arg(long, value_parser = parse_duration, default_value = "10s")]
        grace: Duration,
        /// The command and its arguments.
        #[arg(required = true, last = true, value_name = "CMD")]
        command: Vec<String>,
    },
}

/// How to take a lease.
#[derive(Debug, Args)]
pub struct HolderArgs {
    /// Longest wait for the lease, e.g. 30s, 5m (default: wait as long as it takes).
    #[arg(long, value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Holder identity (default: $POD_NAME, else the hostname).
    #[arg(long)]
    pub identity: Option<String>,
}

/// `30s`, `1m30s`, `500ms`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 30s, 5m, 1h30m)"))
}

/// A failed command: what to print and the exit code.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure {
            code: exit::for_error(&e),
            message: e.to_string(),
        }
    }
}

fn failure(message: impl Into<String>) -> Failure {
    Failure {
        code: exit::ERROR,
        message: message.into(),
    }
}

/// Entry point of the `kubectl-fence` binary.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            });
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kubectl fence: cannot start: {e}");
            return ExitCode::from(exit::ERROR);
        }
    };
    let code = runtime.block_on(dispatch(cli)).unwrap_or_else(|f| {
        eprintln!("kubectl fence: {}", f.message);
        f.code
    });
    ExitCode::from(code)
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let (client, namespace) = connect(&cli.global).await?;
    let output = cli.global.output;
    match cli.command {
        Command::Status { lease } => status(client, &namespace, &lease, output).await,
        Command::List => list(client, &namespace, output).await,
        Command::Acquire { lease, holder } => {
            acquire_and_leave(client, &namespace, &lease, holder, output).await
        }
        Command::Release {
            lease,
            identity,
            claim,
        } => release(client, &namespace, &lease, identity, claim).await,
        Command::Run {
            lease,
            holder,
            grace,
            command,
        } => run::run(client, &namespace, &lease, holder, grace, command).await,
    }
}

/// A client and the namespace to use, from the flags, like kubectl.
async fn connect(global: &Global) -> Result<(Client, String), Failure> {
    let options = KubeConfigOptions {
        context: global.context.clone(),
        ..Default::default()
    };
    let config = match (&global.kubeconfig, &global.context) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| failure(format!("reading {}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| e.to_string())
        }
        (None, Some(_)) => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| e.to_string()),
        (None, None) => Config::infer().await.map_err(|e| e.to_string()),
    }
    .map_err(|e| failure(format!("no usable kubeconfig: {e}")))?;
    let namespace = global
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(|e| failure(format!("client: {e}")))?;
    Ok((client, namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_kubectl_and_sleep() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn run_takes_everything_after_the_double_dash_as_the_command() {
        let cli = Cli::try_parse_from([
            "kubectl-fence",
            "-n",
            "jobs",
            "run",
            "db",
            "--wait",
            "5m",
            "--grace",
            "2s",
            "--",
            "sh",
            "-c",
            "echo $FENCE_TOKEN",
            "-n",
        ])
        .unwrap();
        assert_eq!(cli.global.namespace.as_deref(), Some("jobs"));
        let Command::Run {
            lease,
            holder,
            grace,
            command,
        } = cli.command
        else {
            panic!("not run: {:?}", cli.command);
        };
        assert_eq!(lease, "db");
        assert_eq!(holder.wait, Some(Duration::from_secs(300)));
        assert_eq!(grace, Duration::from_secs(2));
        assert_eq!(command, ["sh", "-c", "echo $FENCE_TOKEN", "-n"]);
    }

    #[test]
    fn global_flags_work_after_the_command_too() {
        let cli = Cli::try_parse_from([
            "kubectl-fence",
            "status",
            "db",
            "-n",
            "jobs",
            "--context",
            "prod",
            "-o",
            "yaml",
        ])
        .unwrap();
        assert_eq!(cli.global.namespace.as_deref(), Some("jobs"));
        assert_eq!(cli.global.context.as_deref(), Some("prod"));
        assert_eq!(cli.global.output, Output::Yaml);
        assert!(Cli::try_parse_from(["kubectl-fence", "list", "-o", "wide"]).is_err());
    }

    #[test]
    fn run_needs_a_command_and_defaults_to_waiting_forever() {
        assert!(Cli::try_parse_from(["kubectl-fence", "run", "db"]).is_err());
        let cli = Cli::try_parse_from(["kubectl-fence", "run", "db", "--", "true"]).unwrap();
        let Command::Run { holder, grace, .. } = cli.command else {
            panic!("not run");
        };
        assert_eq!(holder.wait, None);
        assert_eq!(grace, Duration::from_secs(10));
    }

    #[test]
    fn every_command_has_help_with_an_example() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        cmd.build();
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let help = sub
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            assert!(
                help.contains("kubectl fence"),
                "{} has no example",
                sub.get_name()
            );
        }
        Cli::command().debug_assert();
    }
}
