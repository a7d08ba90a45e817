//! The holder processes of the workload. The test binary runs itself again in one of two roles
//! (`JEPSEN_ROLE`):
//! - `holder`: the Rust library. Acquires its lease, asks `token()` before every write and
//!   every few milliseconds besides (so the last instant it believed it held is known
//!   closely), writes the token to the fenced resources (and the workload its lease fences by
//!   kind, see [`crate::workload`]), and lets go (release, drop, or detach so the claim
//!   expires); again and again.
//! - `writer`: the CMD of `kubectl fence run LEASE -- <this binary>`: writes `FENCE_TOKEN` to
//!   the resources until its time is up, `kubectl fence` stops it, or a fence refuses it.
//!
//! Each process runs as a pod of its own (`POD_NAME`, `POD_UID`: its claims name and are owned
//! by it; its kubeconfig carries a token bound to it), as a Deployment's replica would.
//! Every step is recorded in the process's own history file (see [`crate::history`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fenced_lease::api::{FencedLease, LeaseHolder};
use fenced_lease::holder::{AcquireOptions, LeaseGuard, LeaseHandle, LostReason, acquire};
use kube::api::Api;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

use crate::history::{Event, Recorder, Resource, now};
use crate::writes::{ROUNDS, Resources};

/// The library holder asks `token()` this often while it holds.
const PROBE_EVERY: Duration = Duration::from_millis(5);
/// ...and records an Ok answer at most this often (every Err, and the last Ok before it,
/// always).
const PROBE_RECORD_EVERY: u64 = 50_000_000;
/// A zombie reads its lease this often until it has moved on...
const ZOMBIE_POLL: Duration = Duration::from_millis(25);
/// ...then writes until refused, for this long at most.
const ZOMBIE_PROBE: Duration = Duration::from_millis(500);

/// What a worker process is told by the runner, through its environment.
#[derive(Clone, Debug)]
pub struct Settings {
    pub process: String,
    pub namespace: String,
    pub lease: String,
    pub kubeconfig: PathBuf,
    pub run_dir: PathBuf,
    pub postgres: String,
    pub redis: String,
    /// The lease's usual duration (s): holds last a fraction to a few of these.
    pub term: u64,
    pub seed: u64,
    pub kubectl: PathBuf,
    /// The pod the process runs as: name and UID.
    pub pod: Option<(String, String)>,
}

impl Settings {
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("JEPSEN_PROCESS", self.process.clone()),
            ("JEPSEN_NAMESPACE", self.namespace.clone()),
            ("JEPSEN_LEASE", self.lease.clone()),
            ("KUBECONFIG", self.kubeconfig.display().to_string()),
            ("JEPSEN_RUN_DIR", self.run_dir.display().to_string()),
            ("FL_POSTGRES_URL", self.postgres.clone()),
            ("FL_REDIS_URL", self.redis.clone()),
            ("JEPSEN_TERM", self.term.to_string()),
            ("JEPSEN_SEED", self.seed.to_string()),
            ("JEPSEN_KUBECTL", self.kubectl.display().to_string()),
        ];
        if let Some((name, uid)) = &self.pod {
            env.extend([
                ("POD_NAME", name.clone()),
                ("POD_UID", uid.clone()),
                ("POD_NAMESPACE", self.namespace.clone()),
            ]);
        }
        env
    }

    fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
        Settings {
            process: var("JEPSEN_PROCESS"),
            namespace: var("JEPSEN_NAMESPACE"),
            lease: var("JEPSEN_LEASE"),
            kubeconfig: var("KUBECONFIG").into(),
            run_dir: var("JEPSEN_RUN_DIR").into(),
            postgres: var("FL_POSTGRES_URL"),
            redis: var("FL_REDIS_URL"),
            term: var("JEPSEN_TERM").parse().expect("JEPSEN_TERM"),
            seed: var("JEPSEN_SEED").parse().expect("JEPSEN_SEED"),
            kubectl: var("JEPSEN_KUBECTL").into(),
            pod: std::env::var("POD_NAME")
                .ok()
                .zip(std::env::var("POD_UID").ok()),
        }
    }

    /// The file `kubectl fence run`'s writers and library holders check: the run is over.
    pub fn stop_file(run_dir: &std::path::Path) -> PathBuf {
        run_dir.join("STOP")
    }

    fn stopping(&self) -> bool {
        Self::stop_file(&self.run_dir).exists()
    }
}

/// Entry point of a worker process; returns its exit code.
pub fn main(role: &str) -> std::process::ExitCode {
    let settings = Settings::from_env();
    let rec = Arc::new(Recorder::create(
        &settings.run_dir.join(format!("{}.jsonl", settings.process)),
        &settings.process,
    ));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = runtime.block_on(async {
        match role {
            "holder" => holder(settings, rec).await,
            "writer" => writer(settings, rec).await,
            other => panic!("unknown JEPSEN_ROLE {other}"),
        }
    });
    std::process::ExitCode::from(code)
}

async fn client(settings: &Settings) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(&settings.kubeconfig).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    config.read_timeout = None; // holders keep watches open
    config.connect_timeout = Some(Duration::from_secs(5));
    fenced_lease::client::client(config).expect("client")
}

fn rng(settings: &Settings) -> StdRng {
    let mut seed = settings.seed;
    for b in settings.process.bytes() {
        seed = seed.wrapping_mul(31).wrapping_add(u64::from(b));
    }
    StdRng::seed_from_u64(seed)
}

/// A token cancelled once the run's stop file appears.
fn stop_when_told(settings: &Settings) -> CancellationToken {
    let stop = CancellationToken::new();
    tokio::spawn({
        let (stop, settings) = (stop.clone(), settings.clone());
        async move {
            while !settings.stopping() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            stop.cancel();
        }
    });
    stop
}

/// What a library holder works with, from one lease to the next.
struct Holder {
    settings: Settings,
    rec: Arc<Recorder>,
    client: kube::Client,
    resources: Resources,
    rng: StdRng,
    lease: String,
    term: Duration,
    stop: CancellationToken,
}

/// The library holder: acquire, write while holding, let go; until the run stops.
async fn holder(settings: Settings, rec: Arc<Recorder>) -> u8 {
    let client = client(&settings).await;
    let mut h = Holder {
        resources: Resources::new(&settings, client.clone()),
        rng: rng(&settings),
        lease: settings.lease.clone(),
        term: Duration::from_secs(settings.term),
        stop: stop_when_told(&settings),
        client,
        rec,
        settings,
    };
    while !h.stop.is_cancelled() {
        h.rec.record(Event::Waiting {
            lease: h.lease.clone(),
        });
        let Some(guard) = h.try_acquire().await else {
            continue;
        };
        let claim = guard.claim().to_string();
        h.rec.record(Event::Acquired {
            lease: h.lease.clone(),
            claim: claim.clone(),
            token: guard.granted_token().unwrap_or_default(),
        });
        let lost = h.write_while_holding(&guard).await;
        let how = match h.rng.random_range(0..8) {
            0 => {
                let _ = guard.detach(); // the claim is left to expire
                "detached"
            }
            1 | 2 => {
                h.zombie(guard, &claim).await;
                continue;
            }
            3 => {
                drop(guard);
                "dropped"
            }
            _ => {
                let _ = guard.release().await;
                "released"
            }
        };
        // Letting go of a lease already lost hands nothing over.
        let how = if lost { "after-loss" } else { how };
        h.rec.record(Event::Released {
            lease: h.lease.clone(),
            claim,
            how: how.into(),
        });
        tokio::time::sleep(Duration::from_millis(h.rng.random_range(0..400))).await;
    }
    0
}

impl Holder {
    /// One acquire, until granted or the run stops; a failure recorded, then a pause.
    async fn try_acquire(&mut self) -> Option<LeaseGuard> {
        let options = AcquireOptions::default()
            .identity(&self.settings.process)
            .wait(Duration::from_secs(60))
            .cancel(self.stop.clone());
        match acquire(
            self.client.clone(),
            &self.settings.namespace,
            &self.lease,
            options,
        )
        .await
        {
            Ok(guard) => Some(guard),
            Err(e) => {
                self.rec.record(Event::AcquireFailed {
                    lease: self.lease.clone(),
                    error: e.to_string(),
                });
                let pause = self.rng.random_range(200..1000);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                None
            }
        }
    }

    /// Writes while it holds, for a fraction to a few terms, asking `token()` before every
    /// write (and the prober every few milliseconds besides), until a fence refuses it or the
    /// run stops. Whether it found the lease lost.
    async fn write_while_holding(&mut self, guard: &LeaseGuard) -> bool {
        let watcher = tokio::spawn(record_loss(self.rec.clone(), guard.handle()));
        let prober = Prober::start(self.rec.clone(), guard.handle());
        let hold = self.term.mul_f64(self.rng.random_range(0.3..2.0));
        let until = tokio::time::Instant::now() + hold;
        let mut turn = self.rng.random_range(0..ROUNDS.len());
        let mut lost = false;
        while tokio::time::Instant::now() < until && !self.stop.is_cancelled() {
            let Some(token) = ask(&self.rec, guard) else {
                lost = true;
                break;
            };
            turn = (turn + 1) % ROUNDS.len();
            if self
                .resources
                .write(&self.rec, ROUNDS[turn], &self.lease, token)
                .await
            {
                break; // fenced out: a newer holder exists; stop writing
            }
            let pause = self.rng.random_range(5..60);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        prober.stop().await;
        watcher.abort();
        lost
    }

    /// A zombie: it stops renewing and no longer believes it holds (it asks no more), yet
    /// writes its old token once the lease has moved on, as an application that ignores
    /// `token()` would; only the fences stop it.
    async fn zombie(&mut self, guard: LeaseGuard, claim: &str) {
        let token = guard.granted_token().unwrap_or_default();
        let _ = guard.detach();
        self.rec.record(Event::Released {
            lease: self.lease.clone(),
            claim: claim.to_string(),
            how: "detached".into(),
        });
        let moved_on = self.wait_moved_on(token).await;
        // Writes right after that read probe how long the apiserver's cache of the lease still
        // lets this pod write (I11): until the first refusal.
        if let Some(read) = moved_on {
            while read.elapsed() < ZOMBIE_PROBE {
                self.resources.next_workload_write_by(false);
                if self
                    .resources
                    .write(&self.rec, Resource::Workload, &self.lease, token)
                    .await
                {
                    break;
                }
            }
        }
        // Then, once its new holder had time to write, everything; and the workload
        // again (`kubectl`, then the client) a second or two late, as a process that
        // woke from a pause would.
        let pause = self.rng.random_range(100..600);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        for resource in Resource::ALL {
            self.resources
                .write(&self.rec, resource, &self.lease, token)
                .await;
        }
        let late = Duration::from_millis(self.rng.random_range(1_000..2_000));
        if let Some(wait) = moved_on
            .and_then(|read| (read + late).checked_duration_since(tokio::time::Instant::now()))
        {
            tokio::time::sleep(wait).await;
        }
        for kubectl in [true, false] {
            self.resources.next_workload_write_by(kubectl);
            self.resources
                .write(&self.rec, Resource::Workload, &self.lease, token)
                .await;
        }
    }

    /// Until the lease has moved on past `token` (or long enough), reads it from the store (not
    /// a cache); the read that shows it moved on is recorded. When that read came.
    async fn wait_moved_on(&self, token: i64) -> Option<tokio::time::Instant> {
        let leases: Api<FencedLease> =
            Api::namespaced(self.client.clone(), &self.settings.namespace);
        let give_up = tokio::time::Instant::now() + self.term * 3;
        let mut moved_on = None;
        while moved_on.is_none() && tokio::time::Instant::now() < give_up {
            if let Ok(Some(read)) = leases.get_opt(&self.lease).await
                && read
                    .status
                    .as_ref()
                    .is_some_and(|s| s.fencing_token > token)
            {
                self.rec.record(lease_state(&read));
                moved_on = Some(tokio::time::Instant::now());
            } else {
                tokio::time::sleep(ZOMBIE_POLL).await;
            }
        }
        moved_on
    }
}

/// One `token()` call, recorded with its call and return instants.
fn ask(rec: &Recorder, handle: &LeaseHandle) -> Option<i64> {
    let called = now();
    let answer = handle.token();
    let t = now();
    let (lease, claim) = (handle.lease().to_string(), handle.claim().to_string());
    match answer {
        Ok(token) => {
            rec.record_at(
                t,
                Event::TokenOk {
                    lease,
                    claim,
                    token,
                    called,
                },
            );
            Some(token)
        }
        Err(e) => {
            rec.record_at(
                t,
                Event::TokenErr {
                    lease,
                    claim,
                    called,
                    reason: e.to_string(),
                },
            );
            None
        }
    }
}

async fn record_loss(rec: Arc<Recorder>, handle: LeaseHandle) {
    let reason = handle.lost().await;
    let deadline_in = match handle.deadline_from_now() {
        Ok(ahead) => i64::try_from(ahead.as_nanos()).unwrap_or(i64::MAX),
        Err(ago) => -i64::try_from(ago.as_nanos()).unwrap_or(i64::MAX),
    };
    rec.record(Event::Lost {
        lease: handle.lease().into(),
        claim: handle.claim().into(),
        reason: reason.to_string(),
        by_operator: matches!(reason, LostReason::Expired | LostReason::Superseded { .. }),
        deadline_in,
    });
}

/// Asks `token()` every few milliseconds while the lease is held, recording an Ok answer at
/// most every [`PROBE_RECORD_EVERY`], and always the last Ok before the first Err.
struct Prober {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Prober {
    fn start(rec: Arc<Recorder>, handle: LeaseHandle) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let (lease, claim) = (handle.lease().to_string(), handle.claim().to_string());
                let mut recorded = 0u64;
                let mut pending: Option<(u64, u64, i64)> = None;
                let flush = |pending: &mut Option<(u64, u64, i64)>| {
                    if let Some((called, t, token)) = pending.take() {
                        rec.record_at(
                            t,
                            Event::TokenOk {
                                lease: lease.clone(),
                                claim: claim.clone(),
                                token,
                                called,
                            },
                        );
                    }
                };
                loop {
                    let called = now();
                    let answer = handle.token();
                    let t = now();
                    match answer {
                        Ok(token) => {
                            pending = Some((called, t, token));
                            if t - recorded >= PROBE_RECORD_EVERY {
                                flush(&mut pending);
                                recorded = t;
                            }
                        }
                        Err(e) => {
                            flush(&mut pending);
                            rec.record_at(
                                t,
                                Event::TokenErr {
                                    lease: lease.clone(),
                                    claim: claim.clone(),
                                    called,
                                    reason: e.to_string(),
                                },
                            );
                            return;
                        }
                    }
                    tokio::select! {
                        () = stop.cancelled() => {
                            flush(&mut pending);
                            return;
                        }
                        () = tokio::time::sleep(PROBE_EVERY) => {}
                    }
                }
            }
        });
        Prober { stop, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// CMD of `kubectl fence run`: writes FENCE_TOKEN until its time is up, SIGTERM, or a
/// refusal. It cannot tell whether it still holds: only the fences stop a stale one.
async fn writer(settings: Settings, rec: Arc<Recorder>) -> u8 {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let token: i64 = var("FENCE_TOKEN").parse().expect("FENCE_TOKEN");
    let (lease, claim) = (var("FENCE_LEASE"), var("FENCE_CLAIM"));
    let pid = std::process::id();
    let pid_file = settings.run_dir.join("pids").join(format!("{pid}"));
    let _ = std::fs::write(&pid_file, &settings.process);
    rec.record(Event::CmdStarted {
        lease: lease.clone(),
        claim: claim.clone(),
        token,
        pid,
    });
    let client = client(&settings).await;
    let resources = Resources::new(&settings, client);
    let mut rng = rng(&settings);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    let until = tokio::time::Instant::now()
        + Duration::from_secs(settings.term).mul_f64(rng.random_range(0.3..2.0));
    let mut turn = rng.random_range(0..ROUNDS.len());
    let code = loop {
        if tokio::time::Instant::now() >= until || settings.stopping() {
            break 0;
        }
        turn = (turn + 1) % ROUNDS.len();
        let refused = tokio::select! {
            _ = term.recv() => {
                rec.record(Event::CmdStopped { lease: lease.clone(), claim: claim.clone() });
                break 143;
            }
            refused = resources.write(&rec, ROUNDS[turn], &lease, token) => refused,
        };
        if refused {
            break 3; // fenced out: stop
        }
        tokio::select! {
            _ = term.recv() => {
                rec.record(Event::CmdStopped { lease: lease.clone(), claim: claim.clone() });
                break 143;
            }
            () = tokio::time::sleep(Duration::from_millis(rng.random_range(5..60))) => {}
        }
    };
    let _ = std::fs::remove_file(&pid_file);
    code
}

/// A FencedLease as read or watched, for the history.
pub fn lease_state(lease: &FencedLease) -> Event {
    let status = lease.status.clone().unwrap_or_default();
    Event::LeaseState {
        lease: lease.metadata.name.clone().unwrap_or_default(),
        uid: lease.metadata.uid.clone().unwrap_or_default(),
        rv: lease
            .metadata
            .resource_version
            .as_deref()
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0),
        holder: status.holder.as_ref().map(holder_claim),
        identity: status.holder.as_ref().map(|h| h.identity.clone()),
        token: status.fencing_token,
        term: status.lease_duration_seconds,
        waiting: status.waiting,
        pod: status.holder.as_ref().and_then(|h| h.pod_uid.clone()),
        follows: status
            .holder
            .as_ref()
            .and_then(|h| h.lease.as_ref().map(|l| l.name.clone())),
    }
}

/// A holder as the history names it: its claim, or for the holder of a followed Lease (no
/// claim) `<identity>@<leaseTransitions>`, a name per term of that Lease (the Go holder's
/// `claimOf` spells it the same way).
pub fn holder_claim(holder: &LeaseHolder) -> String {
    match &holder.lease {
        Some(term) if holder.claim.is_empty() => {
            format!("{}@{}", holder.identity, term.lease_transitions)
        }
        _ => holder.claim.clone(),
    }
}
