//! `kubectl fence`: the holder side from the command line. `run LEASE -- CMD` is flock(1) for
//! Kubernetes; `status`, `list`, `acquire` and `release` are for people and scripts.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::holder::{Error, report};

mod child;
mod commands;
mod complete;
pub mod exit;
pub mod report;
mod run;
mod signals;
mod watch;

use commands::{acquire_and_leave, list, release, status};

/// The exit-code table shown by `--help` (a macro, so that it can be `concat!`ed).
macro_rules! exit_codes {
    () => {
        "\
Exit codes:
  0     success (run: CMD's own code when it ran to the end while the lease was held)
  1     error (lease not found, bad kubeconfig, unexpected API error)
  2     bad command line
  69    Kubernetes API unavailable (waiting: still unavailable when --wait ran out)
  75    not acquired within --wait (--wait 0: the lease is held or others wait)
  76    lease lost while CMD ran (CMD's group was sent SIGTERM, then SIGKILL after --grace)
  77    forbidden (403): bind the holder Role (deploy/rbac/holder-role.yaml); a claim can
        be changed only by its creator (by the pod that made it, when made from a pod);
        release --all: a claim it could not release. Also when a heartbeat is refused so
        while CMD ran
  126   CMD could not be executed
  127   CMD not found
  128+N ended by signal N: run: CMD was; waiting: kubectl fence was (130 Ctrl-C, 143 SIGTERM)"
    };
}

/// The environment variables `kubectl fence` reads, shown by `--help`.
macro_rules! environment {
    () => {
        "\
Environment:
  KUBECONFIG      kubeconfig files, as for kubectl (else ~/.kube/config, else in-cluster)
  POD_NAME        the pod this runs in (downward API): the claim names it, so the operator
                  annotates it with the token; also the default identity's prefix
  POD_UID         that pod's UID: the claim is owned by the pod, so deleting the pod
                  deletes the claim (and frees the lease)
  POD_NAMESPACE   that pod's namespace (else read from the ServiceAccount mount,
                  /var/run/secrets/kubernetes.io/serviceaccount/namespace); a pod in
                  another namespace than the lease is not named
  RUST_LOG        log level and filters (default warn,kube_client=off), logs go to stderr"
    };
}

/// Fenced leases from the command line: hold a lease while a command runs, with a fencing
/// token the protected resource checks.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-fence",
    bin_name = "kubectl fence",
    version,
    after_help = "Examples:\n  kubectl fence run db-migrate --wait 5m -- ./migrate.sh\n  kubectl fence status db-migrate\n  kubectl fence list -A -o wide",
    after_long_help = concat!(
        "Examples:\n  kubectl fence run db-migrate --wait 5m -- ./migrate.sh\n  kubectl fence status db-migrate\n  kubectl fence list -A -o wide\n\n",
        exit_codes!(), "\n\n", environment!()
    ),
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// kubectl's connection flags, accepted before or after the command.
#[derive(Debug, Default, Args)]
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
    /// User to impersonate for the operation, as kubectl's --as.
    #[arg(long = "as", global = true, value_name = "USER")]
    pub impersonate: Option<String>,
    /// Group to impersonate (repeat for several); needs --as.
    #[arg(
        long = "as-group",
        global = true,
        value_name = "GROUP",
        requires = "impersonate"
    )]
    pub impersonate_groups: Vec<String>,
    /// Longest wait for one API request, e.g. 5s, 1m; 0 keeps the defaults (30s for
    /// status/list/release; a third of the lease duration for a holder, whose heartbeats
    /// never wait past its safe deadline anyway).
    #[arg(long, global = true, value_parser = parse_duration, value_name = "DURATION")]
    pub request_timeout: Option<Duration>,
}

impl Global {
    /// The per-request timeout asked for (`0` is the default).
    fn request_timeout(&self) -> Option<Duration> {
        self.request_timeout.filter(|t| !t.is_zero())
    }
}

/// Output formats of `status` and `list`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// More columns: duration, claim, pod, heartbeat.
    Wide,
    /// `fencedlease.fencing.dev/<name>`, one a line.
    Name,
    Json,
    Yaml,
}

/// Output formats of `acquire` (default: the token alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AcquireFormat {
    /// `fencedleaseclaim.fencing.dev/<claim>`: what `release` takes.
    Name,
    Json,
    Yaml,
}

/// Output format of `release` (default: a sentence per claim).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NameFormat {
    /// `fencedleaseclaim.fencing.dev/<claim>` per claim deleted.
    Name,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show a lease: holder, token, expiry and the waiting queue.
    ///
    /// With -w, a line for the lease as it is, then one each time it changes hands (a new
    /// holder or token, nobody holding, the lease deleted), until interrupted; with -o json or
    /// yaml, the whole status at each change.
    #[command(
        after_help = "Examples:\n  kubectl fence status db-migrate -n jobs -o json\n  kubectl fence status db-migrate -w"
    )]
    Status {
        /// The FencedLease.
        lease: String,
        /// Output format (default: a description; with -w, a line per change of hands).
        #[arg(short = 'o', long, value_enum)]
        output: Option<ReportFormat>,
        /// Keep watching: print a line each time the lease changes hands.
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// List the leases of the namespace with holder, token, waiting and expiry.
    #[command(
        after_help = "Example:\n  kubectl fence list -n jobs\n  kubectl fence list -A -o wide"
    )]
    List {
        /// List the leases of every namespace.
        #[arg(short = 'A', long, conflicts_with = "namespace")]
        all_namespaces: bool,
        /// Output format (default: a table).
        #[arg(short = 'o', long, value_enum)]
        output: Option<ReportFormat>,
    },
    /// Wait for a lease, print its token and exit, leaving the claim in place.
    ///
    /// Nothing renews the claim after this command exits: it expires after the lease
    /// duration unless released sooner with `kubectl fence release LEASE CLAIM` (the claim is
    /// printed on stderr, or on stdout with `-o name`). To hold a lease while work runs, use
    /// `kubectl fence run`.
    #[command(
        after_help = "Example:\n  CLAIM=$(kubectl fence acquire db-migrate --wait 30s -o name) && ./write; kubectl fence release db-migrate \"$CLAIM\"",
        after_long_help = concat!(
            "Example:\n  CLAIM=$(kubectl fence acquire db-migrate --wait 30s -o name) && ./write; kubectl fence release db-migrate \"$CLAIM\"\n\n",
            exit_codes!(), "\n\n", environment!()
        )
    )]
    Acquire {
        /// The FencedLease.
        lease: String,
        #[command(flatten)]
        holder: HolderArgs,
        /// Output format (default: the token).
        #[arg(short = 'o', long, value_enum)]
        output: Option<AcquireFormat>,
    },
    /// Release a lease: delete the claims named (or, with --all, every claim on it).
    ///
    /// Deletes exactly the claims it is told to, so it never releases a lease that another
    /// `kubectl fence run` on the same host holds.
    #[command(
        after_help = "Example:\n  kubectl fence release db-migrate db-migrate-x7k2pqr5ct\n  kubectl fence release db-migrate --all --identity nightly-job"
    )]
    Release {
        /// The FencedLease.
        lease: String,
        /// Claims to delete, as `acquire` printed them (`NAME` or
        /// `fencedleaseclaim.fencing.dev/NAME`).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        claims: Vec<String>,
        /// Delete every claim on the lease (with --identity: every claim of that identity).
        #[arg(long)]
        all: bool,
        /// With --all: only the claims of this holder identity.
        #[arg(long, requires = "all", conflicts_with = "claims")]
        identity: Option<String>,
        /// Output format (default: a sentence per claim).
        #[arg(short = 'o', long, value_enum)]
        output: Option<NameFormat>,
    },
    /// Hold a lease while CMD runs (flock for Kubernetes).
    ///
    /// Waits for the lease, then runs CMD with FENCE_TOKEN, FENCE_LEASE, FENCE_HOLDER,
    /// FENCE_CLAIM and FENCE_NAMESPACE in its environment, renews the lease while CMD runs,
    /// and releases it once CMD and every process it left in its process group have ended.
    /// CMD runs in a process group of its own and cannot outlive kubectl fence (on Linux it
    /// is killed if kubectl fence dies). When stdin is a terminal CMD gets it; Ctrl-Z stops
    /// both, `fg` continues both. Signals sent to kubectl fence (INT, TERM, HUP, QUIT, USR1,
    /// USR2, WINCH, TSTP, CONT) are passed on to CMD's group. If the lease is lost, the group
    /// gets SIGTERM, then SIGKILL after --grace. Send FENCE_TOKEN with every write, so the
    /// protected resource can refuse a holder that lost the lease.
    ///
    /// For a CronJob that must skip a run while the previous one still holds the lease:
    /// `--wait 0` takes the lease only if it is free, else exits 75 at once.
    #[command(
        after_help = "Example:\n  kubectl fence run db-migrate --wait 5m -- sh -c './migrate --fence-token \"$FENCE_TOKEN\"'",
        after_long_help = concat!(
            "Examples:\n  kubectl fence run db-migrate --wait 5m -- sh -c './migrate --fence-token \"$FENCE_TOKEN\"'\n  kubectl fence run nightly-report --wait 0 -- ./report.sh   # CronJob: skip while held\n\n",
            exit_codes!(), "\n\n", environment!()
        )
    )]
    Run {
        /// The FencedLease.
        lease: String,
        #[command(flatten)]
        holder: HolderArgs,
        /// Time CMD's group gets to exit after SIGTERM before SIGKILL (lease lost, or
        /// --kill-group).
        #[arg(long, value_parser = parse_duration, default_value = "10s")]
        grace: Duration,
        /// When CMD exits, stop what it left running in its process group (SIGTERM, then
        /// SIGKILL after --grace) instead of holding the lease until that ends too.
        #[arg(long)]
        kill_group: bool,
        /// The command and its arguments.
        #[arg(required = true, last = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Print a shell completion script for `kubectl-fence` typed as one word.
    ///
    /// `kubectl fence <TAB>` needs no script: kubectl (1.26 and later) asks the executable
    /// `kubectl_complete-fence` on PATH, which ships beside kubectl-fence. Commands, flags,
    /// `-o` formats, lease names and, for `release`, claim names are completed; names are
    /// listed from the namespace the command would act in.
    #[command(
        after_help = "Examples:\n  source <(kubectl fence completion bash)\n  kubectl fence completion fish | source"
    )]
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: Shell,
    },
}

/// Shells `completion` writes a script for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// How to take a lease.
#[derive(Debug, Args)]
pub struct HolderArgs {
    /// Longest wait for the lease, e.g. 30s, 5m (default: as long as it takes, riding out
    /// API outages). 0: take it only if it is free (one try).
    #[arg(long, value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Holder identity (default: $POD_NAME, else the hostname, with a random suffix).
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
            message: report(&e),
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
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Some(code) = child::trampoline(&args) {
        return code;
    }
    if args.get(1).is_some_and(|a| a == complete::REQUEST) {
        return complete_words(&args[2..]);
    }
    let cli = match Cli::try_parse_from(args) {
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
                // kube's client logs each failed request too; ours say it once per outage.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_client=off")),
        )
        .init();
    // Before any thread starts, so that all inherit it.
    child::block_sigttou();
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

/// `kubectl-fence __complete WORDS...`: what kubectl_complete-fence and the shell scripts ask.
fn complete_words(words: &[OsString]) -> ExitCode {
    let words: Vec<String> = words
        .iter()
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::from(exit::ERROR);
    };
    print!("{}", runtime.block_on(complete::reply(&words)));
    ExitCode::from(exit::OK)
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    if let Command::Completion { shell } = cli.command {
        print!("{}", complete::script(shell));
        return Ok(exit::OK);
    }
    let (client, namespace) = connect(&cli.global).await?;
    let timeout = cli.global.request_timeout();
    match cli.command {
        Command::Status {
            lease,
            output,
            watch: false,
        } => status(client, &namespace, &lease, output, timeout).await,
        Command::Status {
            lease,
            output,
            watch: true,
        } => watch::status(client, &namespace, &lease, output, timeout).await,
        Command::List {
            all_namespaces,
            output,
        } => {
            let namespace = (!all_namespaces).then_some(namespace.as_str());
            list(client, namespace, output, timeout).await
        }
        Command::Acquire {
            lease,
            holder,
            output,
        } => acquire_and_leave(client, &namespace, &lease, &holder, output, timeout).await,
        Command::Release {
            lease,
            claims,
            all,
            identity,
            output,
        } => {
            let which = match (all, identity) {
                (true, identity) => commands::Which::All { identity },
                (false, _) => commands::Which::Claims(claims),
            };
            release(client, &namespace, &lease, which, output, timeout).await
        }
        Command::Run {
            lease,
            holder,
            grace,
            kill_group,
            command,
        } => {
            let leftovers = run::Leftovers { kill: kill_group };
            run::run(
                client, &namespace, &lease, &holder, timeout, grace, leftovers, &command,
            )
            .await
        }
        Command::Completion { .. } => Ok(exit::OK), // answered above, offline
    }
}

/// A client and the namespace to use, from the flags, like kubectl.
async fn connect(global: &Global) -> Result<(Client, String), Failure> {
    let options = KubeConfigOptions {
        context: global.context.clone(),
        ..Default::default()
    };
    let mut config = match (&global.kubeconfig, &global.context) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| failure(format!("reading {}: {}", path.display(), report(&e))))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| report(&e))
        }
        (None, Some(_)) => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| report(&e)),
        (None, None) => Config::infer().await.map_err(|e| report(&e)),
    }
    .map_err(|e| failure(format!("no usable kubeconfig: {e}")))?;
    if let Some(user) = &global.impersonate {
        config.auth_info.impersonate = Some(user.clone());
        if !global.impersonate_groups.is_empty() {
            config.auth_info.impersonate_groups = Some(global.impersonate_groups.clone());
        }
    }
    let namespace = global
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client =
        crate::client::client(config).map_err(|e| failure(format!("client: {}", report(&e))))?;
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
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
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
            "--kill-group",
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
            kill_group,
            command,
        } = cli.command
        else {
            panic!("not run: {:?}", cli.command);
        };
        assert_eq!(lease, "db");
        assert_eq!(holder.wait, Some(Duration::from_secs(300)));
        assert_eq!(grace, Duration::from_secs(2));
        assert!(kill_group);
        assert_eq!(command, ["sh", "-c", "echo $FENCE_TOKEN", "-n"]);
    }

    #[test]
    fn connection_flags_work_after_the_command_too() {
        let cli = Cli::try_parse_from([
            "kubectl-fence",
            "status",
            "db",
            "-n",
            "jobs",
            "--context",
            "prod",
            "--as",
            "alice",
            "--as-group",
            "ops",
            "--request-timeout",
            "5s",
            "-o",
            "yaml",
        ])
        .unwrap();
        assert_eq!(cli.global.namespace.as_deref(), Some("jobs"));
        assert_eq!(cli.global.context.as_deref(), Some("prod"));
        assert_eq!(cli.global.impersonate.as_deref(), Some("alice"));
        assert_eq!(cli.global.impersonate_groups, ["ops"]);
        assert_eq!(cli.global.request_timeout(), Some(Duration::from_secs(5)));
        assert!(matches!(
            cli.command,
            Command::Status {
                output: Some(ReportFormat::Yaml),
                ..
            }
        ));
        // kubectl's "0": the defaults.
        let cli = Cli::try_parse_from(["kubectl-fence", "list", "--request-timeout", "0"]).unwrap();
        assert_eq!(cli.global.request_timeout(), None);
    }

    /// No flag is accepted only to be ignored: each command takes the outputs it honours,
    /// and combinations that would silently drop a flag are refused.
    #[test]
    fn flags_a_command_would_ignore_are_refused() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("kubectl-fence").chain(args.iter().copied()))
        };
        assert!(parse(&["list", "-o", "wide"]).is_ok());
        assert!(parse(&["list", "-A", "-o", "name"]).is_ok());
        assert!(parse(&["list", "-A", "-n", "jobs"]).is_err());
        assert!(parse(&["run", "db", "-o", "json", "--", "true"]).is_err());
        assert!(parse(&["acquire", "db", "-o", "wide"]).is_err());
        assert!(parse(&["acquire", "db", "-o", "name"]).is_ok());
        assert!(parse(&["status", "db", "--as-group", "ops"]).is_err());
        // release: the claims to delete, or --all; --identity only narrows --all.
        assert!(parse(&["release", "db"]).is_err());
        assert!(parse(&["release", "db", "db-x"]).is_ok());
        assert!(parse(&["release", "db", "--all"]).is_ok());
        assert!(parse(&["release", "db", "--all", "--identity", "me"]).is_ok());
        assert!(parse(&["release", "db", "db-x", "--all"]).is_err());
        assert!(parse(&["release", "db", "db-x", "--identity", "me"]).is_err());
    }

    #[test]
    fn run_needs_a_command_and_defaults_to_waiting_forever() {
        assert!(Cli::try_parse_from(["kubectl-fence", "run", "db"]).is_err());
        let cli = Cli::try_parse_from(["kubectl-fence", "run", "db", "--", "true"]).unwrap();
        let Command::Run {
            holder,
            grace,
            kill_group,
            ..
        } = cli.command
        else {
            panic!("not run");
        };
        assert_eq!(holder.wait, None);
        assert_eq!(grace, Duration::from_secs(10));
        assert!(!kill_group);
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
