//! The holder processes of the workload. The test binary runs itself again in one of two roles
//! (`JEPSEN_ROLE`):
//! - `holder`: the Rust library. Acquires its lease, asks `token()` before every write and
//!   every few milliseconds besides (so the last instant it believed it held is known
//!   closely), writes the token to the three fenced resources, and lets go (release, drop,
//!   or detach so the claim expires); again and again.
//! - `writer`: the CMD of `kubectl fence run LEASE -- <this binary>`: writes `FENCE_TOKEN` to
//!   the resources until its time is up, `kubectl fence` stops it, or a fence refuses it.
//!
//! Every step is recorded in the process's own history file (see [`crate::history`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fenced_lease::api::FencedLease;
use fenced_lease::fence;
use fenced_lease::fence::postgres::FencedTable;
use fenced_lease::holder::{AcquireOptions, LeaseHandle, LostReason, acquire};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Mutex;
use tokio::time::timeout;

use crate::history::{Event, Recorder, Resource, now};

/// Longest wait for one write's answer; past it the write's outcome is unknown.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// The library holder asks `token()` this often while it holds.
const PROBE_EVERY: Duration = Duration::from_millis(5);
/// ...and records an Ok answer at most this often (every Err, and the last Ok before it,
/// always).
const PROBE_RECORD_EVERY: u64 = 50_000_000;

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
}

impl Settings {
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("JEPSEN_PROCESS", self.process.clone()),
            ("JEPSEN_NAMESPACE", self.namespace.clone()),
            ("JEPSEN_LEASE", self.lease.clone()),
            ("KUBECONFIG", self.kubeconfig.display().to_string()),
            ("JEPSEN_RUN_DIR", self.run_dir.display().to_string()),
            ("FL_POSTGRES_URL", self.postgres.clone()),
            ("FL_REDIS_URL", self.redis.clone()),
            ("JEPSEN_TERM", self.term.to_string()),
            ("JEPSEN_SEED", self.seed.to_string()),
        ]
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

/// Names shared by the runner (which creates them) and the workers (which write them).
pub fn config_map_name(lease: &str) -> String {
    format!("jepsen-{lease}")
}

pub fn pg_table(namespace: &str) -> String {
    format!("jepsen_{}", namespace.replace('-', "_"))
}

pub fn redis_key(namespace: &str, lease: &str) -> String {
    format!("{namespace}:{{{lease}}}")
}

/// How one write ended.
enum Outcome {
    Accepted(Option<u64>),
    Refused(i64),
    Failed(String),
}

/// Connections to the three fenced resources.
struct Resources {
    configmaps: Api<ConfigMap>,
    postgres_url: String,
    postgres: Mutex<Option<tokio_postgres::Client>>,
    table: FencedTable,
    redis: Mutex<Option<redis::aio::MultiplexedConnection>>,
    redis_url: String,
    namespace: String,
    writes: AtomicU64,
}

impl Resources {
    fn new(settings: &Settings, client: kube::Client) -> Self {
        Resources {
            configmaps: Api::namespaced(client, &settings.namespace),
            postgres_url: settings.postgres.clone(),
            postgres: Mutex::new(None),
            table: FencedTable::new(&pg_table(&settings.namespace), &["lease"]),
            redis: Mutex::new(None),
            redis_url: settings.redis.clone(),
            namespace: settings.namespace.clone(),
            writes: AtomicU64::new(0),
        }
    }

    /// Writes `token` to `resource` for `lease`, recording the attempt and its outcome.
    /// Returns whether a fence refused it.
    async fn write(&self, rec: &Recorder, resource: Resource, lease: &str, token: i64) -> bool {
        let n = self.writes.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}#{n}", rec.process());
        let key = match resource {
            Resource::Kube => config_map_name(lease),
            Resource::Postgres => lease.to_string(),
            Resource::Redis => redis_key(&self.namespace, lease),
        };
        rec.record(Event::WriteAttempt {
            id: id.clone(),
            resource,
            key: key.clone(),
            lease: lease.into(),
            token,
        });
        let outcome =
            match timeout(WRITE_TIMEOUT, self.send(resource, &key, lease, token, &id)).await {
                Ok(outcome) => outcome,
                Err(_) => Outcome::Failed(format!("no answer within {WRITE_TIMEOUT:?}")),
            };
        let t = now();
        match outcome {
            Outcome::Accepted(seq) => {
                rec.record_at(t, Event::WriteAccepted { id, seq });
                false
            }
            Outcome::Refused(highest) => {
                rec.record_at(t, Event::WriteRefused { id, highest });
                true
            }
            Outcome::Failed(error) => {
                rec.record_at(t, Event::WriteFailed { id, error });
                false
            }
        }
    }

    async fn send(
        &self,
        resource: Resource,
        key: &str,
        lease: &str,
        token: i64,
        id: &str,
    ) -> Outcome {
        let fenced = |e: fence::Error| match e {
            fence::Error::Fenced { highest, .. } => Outcome::Refused(highest),
            other => Outcome::Failed(other.to_string()),
        };
        match resource {
            Resource::Kube => {
                let mut patch = fence::kube::stamp_patch(lease, token);
                patch["data"] = serde_json::json!({ "write": id });
                match self
                    .configmaps
                    .patch(key, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(cm) => Outcome::Accepted(
                        cm.metadata.resource_version.and_then(|rv| rv.parse().ok()),
                    ),
                    Err(e) => fenced(fence::Error::from(e)),
                }
            }
            Resource::Postgres => {
                let mut slot = self.postgres.lock().await;
                if slot.as_ref().is_none_or(|c| c.is_closed()) {
                    match tokio_postgres::connect(&self.postgres_url, tokio_postgres::NoTls).await {
                        Ok((client, connection)) => {
                            tokio::spawn(connection);
                            *slot = Some(client);
                        }
                        Err(e) => return Outcome::Failed(format!("connect: {e}")),
                    }
                }
                let client = slot.as_ref().expect("connected above");
                match self
                    .table
                    .update(client, &[&lease], &[("last_write", &id)], token)
                    .await
                {
                    Ok(()) => Outcome::Accepted(None),
                    Err(e) => fenced(e),
                }
            }
            Resource::Redis => {
                let mut slot = self.redis.lock().await;
                if slot.is_none() {
                    let connected = match redis::Client::open(self.redis_url.as_str()) {
                        Ok(client) => client.get_multiplexed_async_connection().await,
                        Err(e) => Err(e),
                    };
                    match connected {
                        Ok(conn) => *slot = Some(conn),
                        Err(e) => return Outcome::Failed(format!("connect: {e}")),
                    }
                }
                let conn = slot.as_mut().expect("connected above");
                let value = format!("{token} {id}");
                match fence::redis::call(conn, key, token, &["RPUSH", &value]).await {
                    Ok(redis::Value::Int(n)) => Outcome::Accepted(u64::try_from(n).ok()),
                    Ok(other) => Outcome::Failed(format!("unexpected reply {other:?}")),
                    Err(e) => fenced(e),
                }
            }
        }
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
    kube::Client::try_from(config).expect("client")
}

fn rng(settings: &Settings) -> StdRng {
    let mut seed = settings.seed;
    for b in settings.process.bytes() {
        seed = seed.wrapping_mul(31).wrapping_add(u64::from(b));
    }
    StdRng::seed_from_u64(seed)
}

/// The library holder: acquire, write while holding, let go; until the run stops.
async fn holder(settings: Settings, rec: Arc<Recorder>) -> u8 {
    let client = client(&settings).await;
    let resources = Resources::new(&settings, client.clone());
    let mut rng = rng(&settings);
    let lease = settings.lease.clone();
    let term = Duration::from_secs(settings.term);
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn({
        let (stop, settings) = (stop.clone(), settings.clone());
        async move {
            while !settings.stopping() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            stop.cancel();
        }
    });
    while !stop.is_cancelled() {
        rec.record(Event::Waiting {
            lease: lease.clone(),
        });
        let options = AcquireOptions::default()
            .identity(&settings.process)
            .wait(Duration::from_secs(60))
            .cancel(stop.clone());
        let guard = match acquire(client.clone(), &settings.namespace, &lease, options).await {
            Ok(guard) => guard,
            Err(e) => {
                rec.record(Event::AcquireFailed {
                    lease: lease.clone(),
                    error: e.to_string(),
                });
                tokio::time::sleep(Duration::from_millis(rng.random_range(200..1000))).await;
                continue;
            }
        };
        let claim = guard.claim().to_string();
        rec.record(Event::Acquired {
            lease: lease.clone(),
            claim: claim.clone(),
            token: guard.granted_token().unwrap_or_default(),
        });
        let watcher = tokio::spawn(record_loss(rec.clone(), guard.handle()));
        let prober = Prober::start(rec.clone(), guard.handle());

        let hold = term.mul_f64(rng.random_range(0.3..2.0));
        let until = tokio::time::Instant::now() + hold;
        let mut turn = rng.random_range(0..3);
        let mut lost = false;
        while tokio::time::Instant::now() < until && !stop.is_cancelled() {
            let Some(token) = ask(&rec, &guard) else {
                lost = true;
                break;
            };
            turn = (turn + 1) % 3;
            if resources
                .write(&rec, Resource::ALL[turn], &lease, token)
                .await
            {
                break; // fenced out: a newer holder exists; stop writing
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(5..60))).await;
        }
        prober.stop().await;
        watcher.abort();
        let how = match rng.random_range(0..8) {
            0 => {
                let _ = guard.detach(); // the claim is left to expire
                "detached"
            }
            1 | 2 => {
                // A zombie: it stops renewing and no longer believes it holds (it asks no
                // more), yet writes its old token once the lease has moved on, as an
                // application that ignores `token()` would; only the fences stop it.
                let token = guard.granted_token().unwrap_or_default();
                let _ = guard.detach();
                rec.record(Event::Released {
                    lease: lease.clone(),
                    claim: claim.clone(),
                    how: "detached".into(),
                });
                // Until the lease has moved on (or long enough), and its new holder had time
                // to write.
                let leases: Api<FencedLease> = Api::namespaced(client.clone(), &settings.namespace);
                let give_up = tokio::time::Instant::now() + term * 3;
                while tokio::time::Instant::now() < give_up {
                    let moved_on = leases
                        .get_opt(&lease)
                        .await
                        .ok()
                        .flatten()
                        .and_then(|l| l.status)
                        .is_some_and(|s| s.fencing_token > token);
                    if moved_on {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                tokio::time::sleep(Duration::from_millis(rng.random_range(100..600))).await;
                for resource in Resource::ALL {
                    resources.write(&rec, resource, &lease, token).await;
                }
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
        rec.record(Event::Released {
            lease: lease.clone(),
            claim,
            how: how.into(),
        });
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..400))).await;
    }
    0
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
    let mut turn = rng.random_range(0..3);
    let code = loop {
        if tokio::time::Instant::now() >= until || settings.stopping() {
            break 0;
        }
        turn = (turn + 1) % 3;
        let refused = tokio::select! {
            _ = term.recv() => {
                rec.record(Event::CmdStopped { lease: lease.clone(), claim: claim.clone() });
                break 143;
            }
            refused = resources.write(&rec, Resource::ALL[turn], &lease, token) => refused,
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
