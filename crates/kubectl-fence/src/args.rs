//! `kubectl fence`'s command line: its commands, flags and `--help` texts (clap).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

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
    pub(super) fn request_timeout(&self) -> Option<Duration> {
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
    /// Waits for the lease, then runs CMD with FENCE_TOKEN, FENCE_SCOPE, FENCE_LEASE,
    /// FENCE_HOLDER, FENCE_CLAIM and FENCE_NAMESPACE in its environment, renews the lease while CMD runs,
    /// and releases it once CMD and every process it left in its process group have ended.
    /// CMD runs in a process group of its own and cannot outlive kubectl fence (on Linux it
    /// is killed if kubectl fence dies). When stdin is a terminal CMD gets it; Ctrl-Z stops
    /// both, `fg` continues both. Signals sent to kubectl fence (INT, TERM, HUP, QUIT, USR1,
    /// USR2, WINCH, TSTP, CONT) are passed on to CMD's group. If the lease is lost, the group
    /// gets SIGTERM, then SIGKILL after --grace. Send FENCE_TOKEN with every write, so the
    /// protected resource can refuse a holder that lost the lease; FENCE_SCOPE names what it
    /// fences (the scope of a PostgreSQL table or Redis keys; --scope, else
    /// `<namespace>/<lease>`).
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
        /// The scope CMD's writes present their token to (FENCE_SCOPE): the name a
        /// PostgreSQL table is bound to, or the hash tag of Redis keys (default:
        /// `<namespace>/<lease>`).
        #[arg(long, value_parser = parse_scope)]
        scope: Option<String>,
        /// The exit code by which CMD says a write of its was refused for a stale token (a
        /// PostgreSQL SQLSTATE FL001, a Redis FENCED, an apiserver 403 of the fence): kubectl
        /// fence then reports the refusal as the libraries do (an error line, and a Warning
        /// Event WriteRefused on the lease, which the operator counts for the critical alert
        /// FencedLeaseWriteRefused) before it exits with that code.
        #[arg(long, value_name = "CODE", value_parser = clap::value_parser!(u8).range(1..))]
        refused_exit_code: Option<u8>,
        /// The command and its arguments.
        #[arg(required = true, last = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Print the token this pod holds on a lease, as soon as it is granted.
    ///
    /// Reads the lease's status (the grant itself), where the pod's annotation
    /// `token.fencing.dev/<lease>` reaches a downward-API file only when the kubelet next
    /// refreshes the pod's volumes. Exits 75, printing nothing, while the pod does not hold the
    /// lease. With --file the token is the file's whole content (empty while not held), written
    /// atomically; with -w it is kept current until interrupted: a sidecar that gives an
    /// unmodified workload (one whose leader election a FencedLease follows) its token in a
    /// shared emptyDir volume. Needs get and watch on fencedleases (the holder role).
    #[command(after_help = "Examples:
  kubectl fence token db-migrate --pod \"$POD_NAME\"
  kubectl fence token my-controller -w --file /var/run/fence/token   # a sidecar")]
    Token {
        /// The FencedLease.
        lease: String,
        /// The pod whose token to print.
        #[arg(long, env = "POD_NAME", value_name = "NAME")]
        pod: String,
        /// That pod's UID: a pod replaced under the same name does not hold its
        /// predecessor's lease.
        #[arg(long, env = "POD_UID", value_name = "UID")]
        pod_uid: Option<String>,
        /// Write the token to this file (its whole content; empty while not held) instead of
        /// printing it.
        #[arg(long, value_name = "PATH")]
        file: Option<std::path::PathBuf>,
        /// Keep it current: print (or write) the token each time it changes.
        #[arg(short = 'w', long)]
        watch: bool,
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

/// A scope name the guards take (`fence::check_scope`).
fn parse_scope(s: &str) -> Result<String, String> {
    fenced_lease::fence::check_scope(s).map_err(|e| e.to_string())?;
    Ok(s.to_string())
}

/// `30s`, `1m30s`, `500ms`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 30s, 5m, 1h30m)"))
}
