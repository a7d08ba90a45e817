//! The three figures of a configuration: how long until a candidate holds a free lease
//! (acquire), a lease another holder has just released (hand-over), and a lease whose holder
//! was SIGKILLed (failover, minus the lease duration). Each figure is a candidate's
//! `leading` stamp minus the wall-clock instant the bench acted.

use std::process::Command;
use std::time::{Duration, Instant};

use fenced_lease::api::FencedLease;
use fenced_lease_operator::reconcile::finalizer::FINALIZER;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use nix::sys::signal::Signal;

use super::Args;
use super::candidate::unix_ns;
use super::configs::{Config, GoApi, System};
use super::process::{Proc, go_candidate};
use crate::figures::{Results, ms};
use crate::objects::lease;
use crate::{Res, fail};

pub(super) struct Bench {
    pub(super) args: Args,
    pub(super) client: kube::Client,
    pub(super) ns: String,
    /// The floor's namespace, which no operator serves.
    pub(super) floor_ns: String,
    pub(super) results: Results,
}

/// What one config measured, over every round.
#[derive(Default)]
pub(super) struct Figures {
    acquire: Vec<f64>,
    handover: Vec<f64>,
    failover: Vec<f64>,
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
    pub(super) fn chosen(&self, config: &Config) -> bool {
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
    pub(super) async fn measure(
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
        let prefix = format!("c{index}-r{round}");
        self.acquires(config, &prefix, n, &mut into.acquire).await?;
        if let System::Floor(_) = config.system {
            return Ok(()); // nothing to hand over: the floor writes one grant
        }
        self.takeovers(
            config,
            &prefix,
            Takeover::HandOver,
            n_handover,
            &mut into.handover,
        )
        .await?;
        self.takeovers(
            config,
            &prefix,
            Takeover::Failover,
            n_slow,
            &mut into.failover,
        )
        .await
    }

    /// How long a config's candidate may take to lead.
    fn timeout(config: &Config) -> Duration {
        config.duration * 3 + Duration::from_secs(30)
    }

    /// Acquire: a free lease, a fresh one each time.
    async fn acquires(
        &self,
        config: &Config,
        prefix: &str,
        n: usize,
        into: &mut Vec<f64>,
    ) -> Res<()> {
        for i in 0..n {
            let lease = format!("{prefix}-free-{i}");
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
            let at = cand.expect("leading", Self::timeout(config)).await?;
            into.push((at - t0) as f64 / 1e6);
            cand.release().await;
        }
        Ok(())
    }

    /// Takeovers of a held lease by a waiting candidate, `n` times: the holder stopped as `how`
    /// says, each sample from that stop to the waiter leading.
    async fn takeovers(
        &self,
        config: &Config,
        prefix: &str,
        how: Takeover,
        n: usize,
        into: &mut Vec<f64>,
    ) -> Res<()> {
        let timeout = Self::timeout(config);
        let lease = format!("{prefix}-{}", how.lease_suffix());
        self.prepare(config, &lease).await?;
        let mut holder = self.candidate(config, &lease).await?;
        holder.go();
        holder.expect("leading", timeout).await?;
        for _ in 0..n {
            let mut waiter = self.candidate(config, &lease).await?;
            waiter.go();
            self.settle(config).await;
            let t0 = unix_ns();
            match how {
                Takeover::HandOver => holder.signal(Signal::SIGTERM),
                Takeover::Failover => holder.kill(),
            }
            let at = waiter.expect("leading", timeout).await?;
            let took = (at - t0) as f64 / 1e6;
            match how {
                Takeover::HandOver => {
                    into.push(took);
                    // For lining samples up with the operator's log: both stamps, ns since the
                    // epoch.
                    eprintln!(
                        "hand-over {}: SIGTERM at {t0}, leading at {at}",
                        config.name
                    );
                    holder.release().await;
                }
                Takeover::Failover => into.push(took - ms(config.duration)),
            }
            holder = waiter;
        }
        holder.release().await;
        Ok(())
    }

    pub(super) fn report(&self, config: &Config, figures: &Figures) {
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

/// How a holder gives up its lease in [`Bench::takeovers`].
#[derive(Clone, Copy)]
enum Takeover {
    /// It releases (SIGTERM: a graceful stop), the waiter takes over.
    HandOver,
    /// It is SIGKILLed; figures are minus the lease duration.
    Failover,
}

impl Takeover {
    fn lease_suffix(self) -> &'static str {
        match self {
            Takeover::HandOver => "handover",
            Takeover::Failover => "failover",
        }
    }
}
