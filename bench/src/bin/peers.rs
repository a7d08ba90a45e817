//! Side by side, against the same control plane: how long until a candidate holds a free
//! lease (acquire), holds a lease another holder has just released (hand-over), and holds a
//! lease whose holder was SIGKILLed (failover, minus the lease duration), for
//!
//! - fenced-lease: the library (`fenced_lease::holder::acquire`), `kubectl fence run`, and the
//!   Go library's two election paths (`go/examples/bench-candidate`): its own elector (package
//!   `election`) and client-go's elector on the FencedLease lock (package `lock`, as
//!   controller-runtime's manager uses it);
//! - kube-lease-manager (the Rust crate) on a coordination.k8s.io Lease;
//! - client-go's `tools/leaderelection` (`bench/leaderelection`, built by
//!   `hack/bench-leaderelection`) on a coordination.k8s.io Lease;
//!
//! each with its default timings and with the fastest it allows; and, for the acquire only, the
//! floor of a token the server issues: one process that creates a claim and then writes its
//! grant into the lease's status itself, back to back, in a namespace no operator serves. A
//! fenced-lease acquire minus the floor is what the watches and the operator add to the two
//! writes.
//!
//! Every candidate is its own process, so a SIGKILL is a real one; each prints
//! `leading <unix ns>` when it holds, and the figures are that stamp minus the wall-clock
//! instant the bench acted.
//!
//! ```console
//! $ eval "$(hack/control-plane up)"
//! $ cargo build --release --bin fenced-lease-operator --bin kubectl-fence
//! $ (cd go && go build -o /tmp/bench-candidate ./examples/bench-candidate)
//! $ cargo run --release --bin bench-peers -- --leaderelection "$(hack/bench-leaderelection)" \
//!     --go-candidate /tmp/bench-candidate
//! ```

use fenced_lease_bench::common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use common::*;
use fenced_lease::api::{FencedLease, FencedLeaseClaim, FencedLeaseStatus, LeaseHolder};
use fenced_lease_operator::reconcile::token_records::FINALIZER;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::sync::mpsc;

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    candidate: Option<Candidate>,
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
struct Target {
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    lease: String,
    #[arg(long)]
    identity: String,
}

/// A candidate process (the bench runs itself as one).
#[derive(Subcommand)]
enum Candidate {
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

fn unix_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

fn say(what: &str) {
    println!("{what} {}", unix_ns());
    let _ = std::io::stdout().flush();
}

fn wait_for_go() {
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

async fn run_candidate(candidate: Candidate) -> Res<()> {
    let client = fenced_lease::client::infer().await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    match candidate {
        Candidate::Fenced(Target {
            namespace,
            lease,
            identity,
        }) => {
            let _ = Api::<FencedLease>::namespaced(client.clone(), &namespace)
                .get_opt(&lease)
                .await;
            say("ready");
            tokio::task::spawn_blocking(wait_for_go).await?;
            let options = fenced_lease::holder::AcquireOptions::default()
                .identity(identity)
                .wait(Duration::from_secs(600));
            let guard = fenced_lease::holder::acquire(client, &namespace, &lease, options).await?;
            say("leading");
            tokio::select! {
                _ = term.recv() => guard.release().await?,
                reason = guard.lost() => { say("stopped"); eprintln!("lost: {reason:?}"); }
            }
        }
        Candidate::Floor(Target {
            namespace,
            lease,
            identity,
        }) => {
            let leases = Api::<FencedLease>::namespaced(client.clone(), &namespace);
            let claims = Api::<FencedLeaseClaim>::namespaced(client, &namespace);
            let mut object = leases.get(&lease).await?;
            say("ready");
            tokio::task::spawn_blocking(wait_for_go).await?;
            let made = claims
                .create(&PostParams::default(), &claim(&identity, &lease))
                .await?;
            object.status = Some(floor_grant(&object, &made));
            leases
                .replace_status(&lease, &PostParams::default(), &object)
                .await?;
            say("leading");
            term.recv().await;
        }
        Candidate::Klm {
            target,
            duration,
            grace,
        } => {
            use kube_lease_manager::{LeaseCreateMode, LeaseManagerBuilder};
            let manager = LeaseManagerBuilder::new(client, target.lease)
                .with_namespace(target.namespace)
                .with_identity(target.identity)
                .with_duration(duration)
                .with_grace(grace)
                .with_create_mode(LeaseCreateMode::AutoCreate)
                .build()
                .await?;
            say("ready");
            tokio::task::spawn_blocking(wait_for_go).await?;
            let hold = async {
                loop {
                    match manager.changed().await {
                        Ok(true) => say("leading"),
                        Ok(false) => say("stopped"),
                        Err(e) => {
                            eprintln!("kube-lease-manager: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            };
            tokio::select! {
                () = hold => {}
                _ = term.recv() => {}
            }
            manager.release().await?;
        }
    }
    Ok(())
}

/// The status the operator writes when it grants a free `lease` to `claim`: the next token,
/// the holder, the term, and the `Held` condition.
fn floor_grant(lease: &FencedLease, claim: &FencedLeaseClaim) -> FencedLeaseStatus {
    let old = lease.status.clone().unwrap_or_default();
    let now = k8s_openapi::jiff::Timestamp::now();
    FencedLeaseStatus {
        holder: Some(LeaseHolder {
            claim: claim.name_any(),
            claim_uid: claim.uid().unwrap_or_default(),
            identity: claim.spec.holder_identity.clone(),
            ..LeaseHolder::default()
        }),
        fencing_token: old.fencing_token + 1,
        acquire_time: Some(MicroTime(now)),
        lease_duration_seconds: Some(lease.spec.lease_duration_seconds),
        lease_transitions: old.lease_transitions + 1,
        waiting: 0,
        conditions: vec![Condition {
            type_: "Held".into(),
            status: "True".into(),
            reason: "Held".into(),
            message: format!(
                "held by {} with token {}",
                claim.spec.holder_identity,
                old.fencing_token + 1
            ),
            last_transition_time: Time(now),
            observed_generation: lease.metadata.generation,
        }],
        observed_generation: lease.metadata.generation,
    }
}

// --- the systems ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum System {
    /// fenced-lease library, lease duration in seconds.
    Library(u32),
    /// kubectl fence run, lease duration in seconds.
    Cli(u32),
    /// The Go library on a FencedLease of this many seconds: its own elector (package
    /// election), or client-go's elector on its resourcelock (package lock, `-lock`).
    Go(u32, GoApi),
    /// kube-lease-manager: duration and grace, seconds.
    Klm(u64, u64),
    /// client-go: lease duration, renew deadline, retry period.
    ClientGo(Duration, Duration, Duration),
    /// The floor (acquire only): a claim's create and its grant, by one process, on a
    /// FencedLease of this many seconds.
    Floor(u32),
}

/// Which of the Go library's election paths a Go candidate takes.
#[derive(Clone, Copy, Debug)]
enum GoApi {
    Election,
    Lock,
}

struct Config {
    name: String,
    system: System,
    /// The lease duration (failover is reported minus it).
    duration: Duration,
    /// The holder's renew period or the waiter's poll period: the random settle before an
    /// action spans it, so the action falls anywhere in the cycle.
    period: Duration,
}

fn configs() -> Vec<Config> {
    let s = Duration::from_secs;
    let ms = Duration::from_millis;
    vec![
        Config {
            name: "fenced-lease library, 15 s lease (default)".into(),
            system: System::Library(15),
            duration: s(15),
            period: s(5),
        },
        Config {
            name: "fenced-lease library, 1 s lease (fastest)".into(),
            system: System::Library(1),
            duration: s(1),
            period: ms(333),
        },
        Config {
            name: "kubectl fence run, 15 s lease (default)".into(),
            system: System::Cli(15),
            duration: s(15),
            period: s(5),
        },
        Config {
            name: "kubectl fence run, 1 s lease (fastest)".into(),
            system: System::Cli(1),
            duration: s(1),
            period: ms(333),
        },
        Config {
            name: "fenced-lease Go election, 15 s lease (default)".into(),
            system: System::Go(15, GoApi::Election),
            duration: s(15),
            period: s(5),
        },
        Config {
            name: "fenced-lease Go election, 1 s lease (fastest)".into(),
            system: System::Go(1, GoApi::Election),
            duration: s(1),
            period: ms(333),
        },
        Config {
            name: "fenced-lease Go lock (client-go's elector), 15 s lease (default)".into(),
            system: System::Go(15, GoApi::Lock),
            duration: s(15),
            period: s(5),
        },
        Config {
            name: "fenced-lease Go lock (client-go's elector), 1 s lease (fastest)".into(),
            system: System::Go(1, GoApi::Lock),
            duration: s(1),
            period: ms(333),
        },
        Config {
            name: "floor: create a claim, write its grant (no operator)".into(),
            system: System::Floor(15),
            duration: s(15),
            period: s(5),
        },
        Config {
            name: "kube-lease-manager 30/5 s (default)".into(),
            system: System::Klm(30, 5),
            duration: s(30),
            period: s(25),
        },
        Config {
            name: "kube-lease-manager 2/1 s (fastest)".into(),
            system: System::Klm(2, 1),
            duration: s(2),
            period: s(1),
        },
        Config {
            name: "client-go 15/10/2 s (default)".into(),
            system: System::ClientGo(s(15), s(10), s(2)),
            duration: s(15),
            period: s(2),
        },
        Config {
            name: "client-go 1 s/500/100 ms (fastest)".into(),
            system: System::ClientGo(s(1), ms(500), ms(100)),
            duration: s(1),
            period: ms(100),
        },
    ]
}

/// A running candidate and what it prints.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<(String, i128, Option<i32>)>,
    /// kubectl fence run's CMD says its process group after its stamp (others may print
    /// something else there: the Go candidate its token).
    says_group: bool,
    /// Process group of kubectl fence run's CMD, to SIGKILL with it.
    cmd_group: Option<i32>,
}

impl Proc {
    fn spawn(mut command: Command) -> Res<Self> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut words = line.split_whitespace();
                let (Some(kind), Some(stamp)) =
                    (words.next(), words.next().and_then(|s| s.parse().ok()))
                else {
                    continue;
                };
                let extra = words.next().and_then(|w| w.parse().ok());
                let _ = tx.send((kind.to_string(), stamp, extra));
            }
        });
        let stdin = child.stdin.take();
        Ok(Proc {
            child,
            stdin,
            lines,
            says_group: false,
            cmd_group: None,
        })
    }

    /// Waits for a line starting with `kind`; returns its stamp.
    async fn expect(&mut self, kind: &str, timeout: Duration) -> Res<i128> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some((k, stamp, extra))) if k == kind => {
                    if self.says_group && extra.is_some() {
                        self.cmd_group = extra;
                    }
                    return Ok(stamp);
                }
                Ok(Some(_)) => {}
                Ok(None) => return fail(format!("candidate exited before saying {kind}")),
                Err(_) => return fail(format!("candidate did not say {kind} within {timeout:?}")),
            }
        }
    }

    fn go(&mut self) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(b"go\n");
            let _ = stdin.flush();
        }
    }

    fn signal(&self, signal: Signal) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), signal);
    }

    /// SIGKILL, with kubectl fence run's CMD.
    fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
        if let Some(group) = self.cmd_group.take() {
            let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }

    /// SIGTERM (a release), then wait for the exit.
    async fn release(&mut self) {
        self.signal(Signal::SIGTERM);
        for _ in 0..500 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.kill();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// A candidate in Go (client-go's or the Go library's): both take the same flags and wait for
/// a line on stdin once ready.
fn go_candidate(
    bin: Option<&PathBuf>,
    flag: &str,
    namespace: &str,
    lease: &str,
    identity: &str,
) -> Res<Command> {
    let bin = bin.ok_or(format!("{flag} is not set"))?;
    let mut c = Command::new(bin);
    c.args([
        "-namespace",
        namespace,
        "-name",
        lease,
        "-identity",
        identity,
    ])
    .arg("-wait-stdin");
    Ok(c)
}

struct Bench {
    args: Args,
    client: kube::Client,
    ns: String,
    /// The floor's namespace, which no operator serves.
    floor_ns: String,
    results: Results,
}

impl Bench {
    /// Starts a candidate of `config` for `lease`; returns once it is ready to go.
    async fn candidate(&self, config: &Config, lease: &str) -> Res<Proc> {
        let identity = format!("cand-{:08x}", rand::random::<u32>());
        let me = std::env::current_exe()?;
        // This bench, run as the candidate `subcommand` in `namespace`.
        let self_as = |subcommand: &str, namespace: &str| {
            let mut c = Command::new(&me);
            c.args([subcommand, "--namespace", namespace, "--lease", lease])
                .args(["--identity", &identity]);
            c
        };
        let mut proc = match &config.system {
            System::Library(_) => Proc::spawn(self_as("fenced", &self.ns))?,
            System::Floor(_) => Proc::spawn(self_as("floor", &self.floor_ns))?,
            System::Klm(d, g) => {
                let mut c = self_as("klm", &self.ns);
                c.args(["--duration", &d.to_string(), "--grace", &g.to_string()]);
                Proc::spawn(c)?
            }
            System::ClientGo(d, r, p) => {
                let bin = self.args.leaderelection.as_ref();
                let mut c = go_candidate(bin, "--leaderelection", &self.ns, lease, &identity)?;
                c.args(["-lease-duration", &format!("{}ms", d.as_millis())]);
                c.args(["-renew-deadline", &format!("{}ms", r.as_millis())]);
                c.args(["-retry-period", &format!("{}ms", p.as_millis())]);
                Proc::spawn(c)?
            }
            System::Go(_, api) => {
                let bin = self.args.go_candidate.as_ref();
                let mut c = go_candidate(bin, "--go-candidate", &self.ns, lease, &identity)?;
                if let GoApi::Lock = api {
                    c.arg("-lock");
                }
                Proc::spawn(c)?
            }
            System::Cli(_) => {
                // No "ready": the CLI is timed from its start, as a user's shell sees it.
                let mut c = Command::new(&self.args.kubectl_fence);
                c.args(["run", lease, "-n", &self.ns, "--identity", &identity, "--"]);
                c.args([
                    "sh",
                    "-c",
                    "echo leading $(date +%s%N) $$; exec sleep 100000",
                ]);
                let mut proc = Proc::spawn(c)?;
                proc.says_group = true;
                return Ok(proc);
            }
        };
        proc.expect("ready", Duration::from_secs(30)).await?;
        Ok(proc)
    }

    async fn fenced_lease(&self, ns: &str, name: &str, duration: u32) -> Res<()> {
        let leases: Api<FencedLease> = Api::namespaced(self.client.clone(), ns);
        leases
            .create(&PostParams::default(), &lease(name, duration))
            .await?;
        Ok(())
    }

    /// Waits until the operator has put its finalizer on lease `name` of the bench's namespace,
    /// so that a first acquire is timed as any later one.
    async fn finalized(&self, name: &str) -> Res<()> {
        let leases: Api<FencedLease> = Api::namespaced(self.client.clone(), &self.ns);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let seen = leases.get(name).await?;
            if seen.finalizers().iter().any(|f| f == FINALIZER) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return fail(format!(
                    "FencedLease {}/{name}: the operator put no finalizer on within 30 s",
                    self.ns
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Creates the lease a config needs (FencedLease for fenced-lease; the peers create their own).
    async fn prepare(&self, config: &Config, name: &str) -> Res<()> {
        match config.system {
            System::Library(d) | System::Cli(d) | System::Go(d, _) => {
                self.fenced_lease(&self.ns, name, d).await?;
                self.finalized(name).await
            }
            // No operator serves the floor's namespace: no finalizer to wait for.
            System::Floor(d) => self.fenced_lease(&self.floor_ns, name, d).await,
            _ => Ok(()),
        }
    }

    async fn settle(&self, config: &Config) {
        let jitter = config.period.mul_f64(rand::random::<f64>());
        tokio::time::sleep(Duration::from_millis(300) + jitter).await;
    }

    /// Whether `config` is to be measured: named by `--only` (if given) and its binary given.
    fn chosen(&self, config: &Config) -> bool {
        let named = self.args.only.is_empty()
            || self
                .args
                .only
                .iter()
                .any(|o| config.name.contains(o.as_str()));
        let missing = match config.system {
            System::ClientGo(..) if self.args.leaderelection.is_none() => {
                Some("no --leaderelection binary (hack/bench-leaderelection builds it)")
            }
            System::Go(..) if self.args.go_candidate.is_none() => {
                Some("no --go-candidate binary (go/examples/bench-candidate)")
            }
            _ => None,
        };
        if let (true, Some(why)) = (named, missing) {
            println!("skipping {}: {why}", config.name);
        }
        named && missing.is_none()
    }

    /// One round of `config`'s three figures: `n` acquires, and `n_slow` hand-overs and
    /// failovers when each takes a 15 s lease or more (else `n`). fenced-lease hands over
    /// on a watch event whatever its lease: `n` hand-overs.
    async fn measure(
        &self,
        config: &Config,
        index: usize,
        round: usize,
        n: usize,
        n_slow: usize,
        into: &mut Figures,
    ) -> Res<()> {
        let slow = config.duration >= Duration::from_secs(15);
        let n_slow = if slow { n_slow } else { n };
        let watches = matches!(
            config.system,
            System::Library(_) | System::Cli(_) | System::Go(..)
        );
        let n_handover = if watches { n } else { n_slow };
        let timeout = config.duration * 3 + Duration::from_secs(30);

        // Acquire: a free lease, a fresh one each time.
        for i in 0..n {
            let lease = format!("c{index}-r{round}-free-{i}");
            self.prepare(config, &lease).await?;
            let mut cand;
            let t0;
            if let System::Cli(_) = config.system {
                t0 = unix_ns();
                cand = self.candidate(config, &lease).await?;
            } else {
                cand = self.candidate(config, &lease).await?;
                t0 = unix_ns();
                cand.go();
            }
            let at = cand.expect("leading", timeout).await?;
            into.acquire.push((at - t0) as f64 / 1e6);
            cand.release().await;
        }
        if let System::Floor(_) = config.system {
            return Ok(()); // nothing to hand over: the floor writes one grant
        }

        // Hand-over: the holder releases (SIGTERM: a graceful stop), the waiter takes over.
        let lease = format!("c{index}-r{round}-handover");
        self.prepare(config, &lease).await?;
        let mut holder = self.candidate(config, &lease).await?;
        holder.go();
        holder.expect("leading", timeout).await?;
        for _ in 0..n_handover {
            let mut waiter = self.candidate(config, &lease).await?;
            waiter.go();
            self.settle(config).await;
            let t0 = unix_ns();
            holder.signal(Signal::SIGTERM);
            let at = waiter.expect("leading", timeout).await?;
            into.handover.push((at - t0) as f64 / 1e6);
            // For lining samples up with the operator's log: both stamps, ns since the epoch.
            eprintln!(
                "hand-over {}: SIGTERM at {t0}, leading at {at}",
                config.name
            );
            holder.release().await;
            holder = waiter;
        }
        holder.release().await;

        // Failover: the holder is SIGKILLed; figures are minus the lease duration.
        let lease = format!("c{index}-r{round}-failover");
        self.prepare(config, &lease).await?;
        let mut holder = self.candidate(config, &lease).await?;
        holder.go();
        holder.expect("leading", timeout).await?;
        for _ in 0..n_slow {
            let mut waiter = self.candidate(config, &lease).await?;
            waiter.go();
            self.settle(config).await;
            let t0 = unix_ns();
            holder.kill();
            let at = waiter.expect("leading", timeout).await?;
            into.failover
                .push((at - t0) as f64 / 1e6 - ms(config.duration));
            holder = waiter;
        }
        holder.release().await;
        Ok(())
    }

    fn report(&self, config: &Config, figures: &Figures) {
        let section = "latency";
        let name = &config.name;
        let r = &self.results;
        r.samples(
            section,
            name,
            "acquire a free lease",
            &figures.acquire,
            "ms",
            "",
        );
        if let System::Floor(_) = config.system {
            return;
        }
        r.samples(
            section,
            name,
            "hand-over after release",
            &figures.handover,
            "ms",
            "",
        );
        let note = format!("lease duration {} s", config.duration.as_secs_f64());
        let figure = "failover after SIGKILL, minus lease duration";
        r.samples(section, name, figure, &figures.failover, "ms", &note);
    }
}

/// What one config measured, over every round.
#[derive(Default)]
struct Figures {
    acquire: Vec<f64>,
    handover: Vec<f64>,
    failover: Vec<f64>,
}

/// `total` samples spread over `rounds`: this round's share (the first rounds take the rest).
fn share(total: usize, rounds: usize, round: usize) -> usize {
    total / rounds + usize::from(round < total % rounds)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Some(candidate) = args.candidate {
        if let Err(e) = run_candidate(candidate).await {
            eprintln!("candidate: {e}");
            std::process::exit(1);
        }
        return;
    }
    if let Err(e) = bench(args).await {
        eprintln!("bench_peers: {e}");
        std::process::exit(1);
    }
}

async fn bench(args: Args) -> Res<()> {
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
    let started = Instant::now();
    let mut outcome = Ok(());
    let chosen: Vec<(usize, Config)> = configs()
        .into_iter()
        .enumerate()
        .filter(|(_, config)| bench.chosen(config))
        .collect();
    let mut figures: Vec<Figures> = chosen.iter().map(|_| Figures::default()).collect();
    let rounds = bench.args.rounds.max(1);
    'rounds: for round in 0..rounds {
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
                println!(
                    "{}",
                    failure_report(&client, &operator, &[&ns], &Grants::default()).await
                );
                outcome = Err(e);
                break 'rounds;
            }
        }
    }
    if outcome.is_ok() {
        for ((_, config), figures) in chosen.iter().zip(&figures) {
            bench.report(config, figures);
        }
    }
    operator.stop();
    println!("{}", operator.log_summary());
    cleanup(&client, &ns).await;
    cleanup(&client, &floor_ns).await;
    outcome
}
