//! What a run sets up and keeps running: a namespace with the leases and the fenced objects
//! (a labelled ConfigMap, and a workload of the kind each lease fences by kind), the
//! PostgreSQL table and its log, two operator replicas (leader election on, each behind its
//! own loopback proxy so that it alone can be cut off), the holder processes (restarted when
//! they die, as a Deployment would, each as a pod of its own), and the observer that records
//! every state of the leases and of the fenced objects a watch delivers. Lease `f`
//! ([`FOLLOWING`]) is held another way: it follows coordination Lease [`FOLLOWED`], which
//! client-go leaders elect on (`jepsenholder -mode=follow`). Besides, lease `d`, which nobody
//! claims, and the collateral writer ([`crate::collateral`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ObjectMeta, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::sync::broadcast;

use crate::collateral::{self, Collateral, FENCE_ONLY};
use crate::common::proxy::Proxy;
use crate::common::{TestNamespace, control_plane};
use crate::history::{Event, LogEntry, Recorder, Resource, Target};
use crate::pods::Pods;
use crate::worker::{Settings, holder_claim, lease_state};
use crate::workload;
use crate::writes::{config_map_name, pg_table, redis_key};
use fenced_lease::api::{FencedLease, LEASE_LABEL, TOKEN_ANNOTATION};

/// The leader-election Lease of the operator replicas (default name).
pub const LEADER_LEASE: &str = "fenced-lease-operator";
/// Seconds a standby waits after the leader's last renewal (the operator's minimum).
pub const LEADER_LEASE_SECONDS: u64 = 3;

/// The leases of a run: name and usual duration (s; of [`FOLLOWING`], client-go's
/// `LeaseDuration` on [`FOLLOWED`]).
pub const LEASES: [(&str, i32); 4] = [("a", 1), ("b", 2), ("c", 3), (FOLLOWING, 3)];
/// The lease that follows coordination Lease [`FOLLOWED`] (`spec.follow`): nobody claims it;
/// its holders are [`FOLLOW_HOLDERS`] client-go leaders of that Lease.
pub const FOLLOWING: &str = "f";
pub const FOLLOWED: &str = "f-election";
/// Holder processes per lease: the Rust library's, `kubectl fence run`'s, and the Go library's
/// (`go/internal/cmd/jepsenholder`): one through package lease, one through package lock with
/// client-go's elector (`-mode=lock`, as controller-runtime's manager holds it).
pub const LIBRARY_HOLDERS: usize = 2;
pub const CLI_HOLDERS: usize = 1;
pub const GO_HOLDERS: usize = 1;
pub const GO_LOCK_HOLDERS: usize = 1;
/// Holder processes of [`FOLLOWING`]: the Go holder in `-mode=follow`, each electing with
/// client-go's own `leaderelection` on [`FOLLOWED`], its pod's name as identity.
pub const FOLLOW_HOLDERS: usize = 2;

/// One operator replica: a process behind its own proxy, restarted when it exits (a replica
/// that loses leadership exits) unless a fault keeps it down.
pub struct Replica {
    pub name: String,
    binary: PathBuf,
    pub proxy: Proxy,
    kubeconfig: PathBuf,
    log: PathBuf,
    namespace: String,
    pub pid: AtomicU32,
    /// A fault keeps it down: do not restart it.
    pub held_down: AtomicBool,
    restarts: AtomicU32,
}

impl Replica {
    fn spawn(&self) -> std::io::Result<tokio::process::Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        tokio::process::Command::new(&self.binary)
            .args([
                "--namespace",
                &self.namespace,
                "--operator-namespace",
                &self.namespace,
            ])
            .args(["--identity", &self.name, "--leader-election=true"])
            .args([
                "--leader-election-lease-seconds",
                &LEADER_LEASE_SECONDS.to_string(),
            ])
            .args([
                "--log-format",
                "text",
                "--metrics-addr",
                "127.0.0.1:0",
                "--api-timeout",
                "5s",
            ])
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
    }

    pub fn signal(&self, signal: Signal) {
        let pid = self.pid.load(Ordering::SeqCst);
        if pid != 0 {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }
}

/// A grant as the observer saw it: the new holder, and how many claims wait behind it.
#[derive(Clone, Debug)]
pub struct Grant {
    pub target: Target,
    pub waiting: i32,
}

/// What kind of holder a slot runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Library,
    Cli,
    /// The Go library's holder: like `Library`, but writes only to the resources that order
    /// writes by token (not the workload fenced by kind).
    Go,
    /// The Go library's holder in `-mode=lock`: as `Go`, holding the lease through package
    /// lock (a `resourcelock.Interface`) and client-go's `leaderelection` elector.
    GoLock,
    /// The Go holder in `-mode=follow`: a client-go leader of [`FOLLOWED`], which writes
    /// (the workload too) while client-go says it leads, asking nothing else.
    Follow,
}

/// One holder slot: a process (re)started for one lease, again and again.
pub struct Slot {
    pub name: String,
    pub lease: String,
    pub kind: Kind,
    /// The running incarnation: its process name (the holder identity) and pid.
    pub current: std::sync::Mutex<Option<(String, u32)>>,
    /// A library holder reaches the apiserver through its own proxy (to be cut off alone).
    pub proxy: Option<Proxy>,
}

impl Slot {
    pub fn signal(&self, signal: Signal) {
        if let Some((_, pid)) = &*self.current.lock().unwrap() {
            let _ = kill(Pid::from_raw(*pid as i32), signal);
        }
    }
}

/// The programs a slot's holder process runs: this test binary (the library holder, and the
/// writer under `kubectl fence run`), `kubectl-fence` and the Go holder.
struct Programs {
    exe: PathBuf,
    kubectl_fence: PathBuf,
    go_holder: PathBuf,
}

impl Programs {
    /// The command of `slot`'s kind of holder, as process `settings.process`.
    fn command(&self, slot: &Slot, settings: &Settings) -> tokio::process::Command {
        match slot.kind {
            Kind::Library => {
                let mut cmd = tokio::process::Command::new(&self.exe);
                cmd.env("JEPSEN_ROLE", "holder");
                cmd
            }
            Kind::Go => tokio::process::Command::new(&self.go_holder),
            Kind::GoLock => {
                let mut cmd = tokio::process::Command::new(&self.go_holder);
                cmd.arg("-mode=lock");
                cmd
            }
            Kind::Follow => {
                let mut cmd = tokio::process::Command::new(&self.go_holder);
                cmd.args(["-mode=follow", &format!("-follow={FOLLOWED}")]);
                cmd
            }
            Kind::Cli => {
                let mut cmd = tokio::process::Command::new(&self.kubectl_fence);
                cmd.args([
                    "run",
                    &slot.lease,
                    "-n",
                    &settings.namespace,
                    "--wait",
                    "60s",
                ])
                .args(["--identity", &settings.process, "--grace", "1s", "--"])
                .arg(&self.exe)
                .env("JEPSEN_ROLE", "writer");
                cmd
            }
        }
    }

    /// Starts `slot`'s holder process with `settings` in its environment, its output appended
    /// to the slot's log.
    fn spawn(&self, slot: &Slot, settings: &Settings) -> tokio::process::Child {
        let mut cmd = self.command(slot, settings);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(settings.run_dir.join(format!("{}.log", slot.name)))
            .expect("holder log");
        cmd.envs(settings.to_env())
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .kill_on_drop(true);
        cmd.spawn().expect("start a holder")
    }
}

/// Everything a run has running.
pub struct Cluster {
    pub ns: TestNamespace,
    pub run_dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub replicas: Vec<Arc<Replica>>,
    pub slots: Vec<Arc<Slot>>,
    pub runner: Arc<Recorder>,
    /// Grants as the observer sees them: (lease, token).
    pub grants: broadcast::Sender<Grant>,
    pub stopping: Arc<AtomicBool>,
    pub postgres: String,
    pub redis: String,
    pub seed: u64,
    /// The writers of what no lease fences (I12).
    pub collateral: Collateral,
    /// This run's own links to the operator and `kubectl-fence` binaries.
    operator: PathBuf,
    kubectl_fence: PathBuf,
    go_holder: PathBuf,
    pods: Pods,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    observer: Vec<tokio::task::JoinHandle<()>>,
}

/// Each lease of the run with its workloads (the object it fences by kind and a scratch one)
/// and its labelled ConfigMap; and the lease that fences objects only.
async fn create_leases_and_fenced_objects(ns: &TestNamespace) {
    for (lease, duration) in LEASES {
        create_lease(ns, lease, duration).await;
        let workloads = workload::api(ns.client.clone(), &ns.name, lease);
        for name in [workload::object_name(lease), workload::scratch_name(lease)] {
            let object: DynamicObject =
                serde_json::from_value(workload::manifest(lease, &name)).expect("a workload");
            workloads
                .create(&PostParams::default(), &object)
                .await
                .expect("create a fenced workload");
        }
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(config_map_name(lease)),
                labels: Some(BTreeMap::from([(LEASE_LABEL.into(), lease.into())])),
                annotations: Some(BTreeMap::from([(TOKEN_ANNOTATION.into(), "0".into())])),
                ..Default::default()
            },
            ..Default::default()
        };
        ns.api::<ConfigMap>()
            .create(&PostParams::default(), &cm)
            .await
            .expect("create the fenced ConfigMap");
    }
    create_lease(ns, FENCE_ONLY, 3).await;
}

/// The run's PostgreSQL table, one row per lease, and its log of accepted writes (a trigger
/// writes it in commit order).
async fn create_postgres_table(ns: &TestNamespace, postgres_url: &str) {
    let pg = postgres(postgres_url).await;
    let table = pg_table(&ns.name);
    pg.batch_execute(&format!(
        "CREATE TABLE {table} (lease TEXT PRIMARY KEY, last_write TEXT, fence_token BIGINT NOT NULL DEFAULT 0);
         CREATE TABLE {table}_log (id BIGSERIAL PRIMARY KEY, lease TEXT NOT NULL, token BIGINT NOT NULL, write TEXT);
         CREATE FUNCTION {table}_log() RETURNS trigger AS $$
           BEGIN INSERT INTO {table}_log (lease, token, write) VALUES (NEW.lease, NEW.fence_token, NEW.last_write); RETURN NEW; END
         $$ LANGUAGE plpgsql;
         CREATE TRIGGER {table}_log AFTER UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION {table}_log();"
    ))
    .await
    .expect("create the PostgreSQL table");
    for (lease, _) in LEASES {
        pg.execute(
            &format!("INSERT INTO {table} (lease) VALUES ($1)"),
            &[&lease],
        )
        .await
        .expect("insert row");
    }
}

/// The holder slots of `lease`: the followed lease's client-go leaders, or the library,
/// `kubectl fence run`, Go and Go-lock holders.
fn slot_kinds(lease: &str) -> Vec<Kind> {
    if lease == FOLLOWING {
        vec![Kind::Follow; FOLLOW_HOLDERS]
    } else {
        (0..LIBRARY_HOLDERS)
            .map(|_| Kind::Library)
            .chain((0..CLI_HOLDERS).map(|_| Kind::Cli))
            .chain((0..GO_HOLDERS).map(|_| Kind::Go))
            .chain((0..GO_LOCK_HOLDERS).map(|_| Kind::GoLock))
            .collect()
    }
}

impl Cluster {
    pub async fn start(run_dir: &Path, seed: u64) -> Cluster {
        let cp = control_plane();
        let ns = TestNamespace::new("jepsen").await;
        ns.with_fence_policies().await;
        let stores = crate::common::fence::datastores();
        let runner = Arc::new(Recorder::create(&run_dir.join("runner.jsonl"), "runner"));
        std::fs::create_dir_all(run_dir.join("pids")).expect("pids dir");

        let pods = Pods::setup(&ns, &run_dir.join("kubeconfigs")).await;
        // Before lease d exists, so that setting up asks nothing of its fence.
        let collateral = Collateral::setup(&ns, &pods).await;
        create_leases_and_fenced_objects(&ns).await;
        create_postgres_table(&ns, &stores.postgres).await;

        let operator = pin_binary(common::bin("fenced-lease-operator"), run_dir);
        let kubectl_fence = pin_binary(common::bin("kubectl-fence"), run_dir);
        let go_holder = build_go_holder(run_dir);
        let (grants, _) = broadcast::channel(1024);
        let mut cluster = Cluster {
            kubeconfig: cp.kubeconfig.clone(),
            ns,
            run_dir: run_dir.into(),
            replicas: vec![],
            slots: vec![],
            runner,
            grants,
            stopping: Arc::new(AtomicBool::new(false)),
            postgres: stores.postgres.clone(),
            redis: stores.redis.clone(),
            seed,
            collateral,
            operator,
            kubectl_fence,
            go_holder,
            pods,
            tasks: vec![],
            observer: vec![],
        };
        cluster.observe();
        let writer = cluster.collateral.spawn(
            Arc::new(Recorder::create(
                &run_dir.join("collateral.jsonl"),
                "collateral",
            )),
            cluster.stopping.clone(),
        );
        cluster.tasks.push(writer);
        cluster.start_replicas().await;
        cluster.start_slots().await;
        cluster
    }

    /// The two operator replicas, each through a proxy of its own, supervised.
    async fn start_replicas(&mut self) {
        for i in 0..2 {
            let name = format!("op-{i}");
            let proxy = Proxy::start(&self.ns).await;
            let replica = Arc::new(Replica {
                kubeconfig: proxy.kubeconfig(&self.ns, &name),
                name,
                binary: self.operator.clone(),
                proxy,
                log: self.run_dir.join(format!("op-{i}.log")),
                namespace: self.ns.name.clone(),
                pid: AtomicU32::new(0),
                held_down: AtomicBool::new(false),
                restarts: AtomicU32::new(0),
            });
            self.supervise_replica(replica.clone());
            self.replicas.push(replica);
        }
    }

    /// Every lease's holder slots, supervised; all but `kubectl fence run`'s through a proxy
    /// of their own.
    async fn start_slots(&mut self) {
        for (lease, _) in LEASES {
            for kind in slot_kinds(lease) {
                let n = self.slots.len();
                let name = match kind {
                    Kind::Library => format!("holder-{n}"),
                    Kind::Cli => format!("cli-{n}"),
                    Kind::Go => format!("go-{n}"),
                    Kind::GoLock => format!("golock-{n}"),
                    Kind::Follow => format!("follow-{n}"),
                };
                let proxy = match kind {
                    Kind::Library | Kind::Go | Kind::GoLock | Kind::Follow => {
                        Some(Proxy::start(&self.ns).await)
                    }
                    Kind::Cli => None,
                };
                let slot = Arc::new(Slot {
                    name,
                    lease: lease.into(),
                    kind,
                    current: std::sync::Mutex::new(None),
                    proxy,
                });
                self.supervise_slot(slot.clone());
                self.slots.push(slot);
            }
        }
    }

    pub fn term_of(lease: &str) -> u64 {
        LEASES
            .iter()
            .find(|(l, _)| *l == lease)
            .map_or(1, |(_, d)| u64::try_from(*d).unwrap_or(1))
    }

    fn supervise_replica(&mut self, replica: Arc<Replica>) {
        let (rec, stopping) = (self.runner.clone(), self.stopping.clone());
        self.tasks.push(tokio::spawn(async move {
            loop {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                if replica.held_down.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                let n = replica.restarts.fetch_add(1, Ordering::SeqCst);
                let mut child = replica.spawn().expect("start fenced-lease-operator");
                let pid = child.id().unwrap_or(0);
                replica.pid.store(pid, Ordering::SeqCst);
                rec.record(Event::Spawned {
                    process: format!("{}.{n}", replica.name),
                    pid,
                    lease: String::new(),
                    pod: None,
                });
                let status = tokio::select! {
                    status = child.wait() => status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()),
                    () = wait_flag(&stopping) => {
                        let _ = child.kill().await;
                        "stopped by the runner".into()
                    }
                };
                replica.pid.store(0, Ordering::SeqCst);
                rec.record(Event::Exited {
                    process: format!("{}.{n}", replica.name),
                    status,
                });
                // A Deployment restarts a replica that exits, after a short pause.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }));
    }

    fn supervise_slot(&mut self, slot: Arc<Slot>) {
        let (rec, stopping) = (self.runner.clone(), self.stopping.clone());
        let pods = self.pods.clone();
        let programs = Programs {
            exe: std::env::current_exe().expect("this test binary"),
            kubectl_fence: self.kubectl_fence.clone(),
            go_holder: self.go_holder.clone(),
        };
        let base = Settings {
            process: String::new(),
            namespace: self.ns.name.clone(),
            lease: slot.lease.clone(),
            kubeconfig: PathBuf::new(),
            run_dir: self.run_dir.clone(),
            postgres: self.postgres.clone(),
            redis: self.redis.clone(),
            term: Cluster::term_of(&slot.lease),
            seed: self.seed,
            kubectl: control_plane().kubectl.clone(),
            pod: None,
        };
        self.tasks.push(tokio::spawn(async move {
            for n in 0.. {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let process = format!("{}.{n}", slot.name);
                // Its own pod, as a Deployment's new replica (retried through a restart of
                // the control plane).
                let pod = loop {
                    match pods.create(&process, slot.proxy.as_ref()).await {
                        Ok(pod) => break pod,
                        Err(_) if stopping.load(Ordering::SeqCst) => return,
                        Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                    }
                };
                let settings = Settings {
                    process: process.clone(),
                    kubeconfig: pod.kubeconfig.clone(),
                    pod: Some((pod.name.clone(), pod.uid.clone())),
                    ..base.clone()
                };
                let mut child = programs.spawn(&slot, &settings);
                let pid = child.id().unwrap_or(0);
                *slot.current.lock().unwrap() = Some((process.clone(), pid));
                rec.record(Event::Spawned {
                    process: process.clone(),
                    pid,
                    lease: slot.lease.clone(),
                    pod: Some(pod.uid),
                });
                let status = child
                    .wait()
                    .await
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string());
                *slot.current.lock().unwrap() = None;
                rec.record(Event::Exited { process, status });
                if !stopping.load(Ordering::SeqCst) {
                    let pause = 200 + (n * 7919 + slot.name.len() as u64 * 131) % 800;
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            }
        }));
    }

    /// Records every state of the leases and of the fenced objects the watches deliver.
    fn observe(&mut self) {
        let rec = Arc::new(Recorder::create(
            &self.run_dir.join("observer.jsonl"),
            "observer",
        ));
        let leases: Api<FencedLease> = self.ns.api();
        let grants = self.grants.clone();
        let rec_l = rec.clone();
        self.observer.push(tokio::spawn(async move {
            let stream = watcher(leases, watcher::Config::default()).default_backoff();
            let mut stream = std::pin::pin!(stream);
            let mut last: BTreeMap<String, (Option<String>, i64)> = BTreeMap::new();
            while let Some(event) = stream.next().await {
                let Ok(event) = event else { continue };
                match event {
                    watcher::Event::Apply(lease) | watcher::Event::InitApply(lease) => {
                        let name = lease.metadata.name.clone().unwrap_or_default();
                        let status = lease.status.clone().unwrap_or_default();
                        let holder = status.holder.as_ref().map(|h| h.claim.clone());
                        rec_l.record(lease_state(&lease));
                        let now = (holder.clone(), status.fencing_token);
                        if let Some(h) = &status.holder
                            && last.get(&name) != Some(&now)
                        {
                            // A followed Lease's candidates wait in client-go, not as
                            // claims: the other leader-to-be is always there.
                            let waiting = if lease.spec.follow.is_some() {
                                1
                            } else {
                                status.waiting
                            };
                            let _ = grants.send(Grant {
                                target: Target {
                                    process: h.identity.clone(),
                                    lease: name.clone(),
                                    claim: holder_claim(h),
                                    token: status.fencing_token,
                                    term: status
                                        .lease_duration_seconds
                                        .unwrap_or(lease.spec.lease_duration_seconds),
                                },
                                waiting,
                            });
                        }
                        last.insert(name, now);
                    }
                    watcher::Event::Delete(lease) => rec_l.record(Event::LeaseGone {
                        lease: lease.metadata.name.clone().unwrap_or_default(),
                        uid: lease.metadata.uid.clone().unwrap_or_default(),
                    }),
                    _ => {}
                }
            }
        }));
        let objects: Api<ConfigMap> = self.ns.api();
        self.observer.push(tokio::spawn(async move {
            let config = watcher::Config::default().labels(LEASE_LABEL);
            let stream = watcher(objects, config).default_backoff();
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) = event else {
                    continue;
                };
                rec.record(Event::ObjectState {
                    key: cm.metadata.name.clone().unwrap_or_default(),
                    rv: cm
                        .metadata
                        .resource_version
                        .as_deref()
                        .and_then(|rv| rv.parse().ok())
                        .unwrap_or(0),
                    token: fenced_lease::fence::kube::token_of(&cm),
                    write: cm.data.as_ref().and_then(|d| d.get("write").cloned()),
                });
            }
        }));
    }

    /// The replica that leads now, as the leader-election Lease says.
    pub async fn leader(&self) -> Option<Arc<Replica>> {
        let lease = self.ns.api::<Lease>().get_opt(LEADER_LEASE).await.ok()??;
        let holder = lease.spec?.holder_identity?;
        self.replicas.iter().find(|r| r.name == holder).cloned()
    }

    /// Waits (up to `within`) until a replica other than `not` leads and renews.
    pub async fn wait_for_leader(&self, not: Option<&str>, within: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + within;
        let mut seen: Option<(String, String)> = None;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(lease)) = self.ns.api::<Lease>().get_opt(LEADER_LEASE).await
                && let Some(spec) = lease.spec
                && let (Some(holder), Some(renewed)) = (spec.holder_identity, spec.renew_time)
                && Some(holder.as_str()) != not
                && self
                    .replicas
                    .iter()
                    .any(|r| r.name == holder && r.pid.load(Ordering::SeqCst) != 0)
            {
                let now = (holder.clone(), format!("{renewed:?}"));
                match &seen {
                    Some(before) if before.0 == now.0 && before.1 != now.1 => return Some(holder),
                    _ => seen = Some(now),
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }

    /// The slot whose current process is `identity`.
    pub fn slot_of(&self, identity: &str) -> Option<Arc<Slot>> {
        self.slots
            .iter()
            .find(|s| {
                s.current
                    .lock()
                    .unwrap()
                    .as_ref()
                    .is_some_and(|(p, _)| p == identity)
            })
            .cloned()
    }

    /// Ends the workload: holders are told to stop (the STOP file, SIGTERM to `kubectl fence`,
    /// which passes it on), then whatever is left is killed, orphaned writers included. Then
    /// the resources' own logs are read and recorded, and the operators stopped.
    pub async fn stop(&mut self) {
        self.runner.record(Event::RunEnd {});
        for replica in &self.replicas {
            replica.signal(Signal::SIGCONT);
            replica.proxy.heal();
        }
        for slot in &self.slots {
            slot.signal(Signal::SIGCONT);
            if let Some(proxy) = &slot.proxy {
                proxy.heal();
            }
        }
        std::fs::write(Settings::stop_file(&self.run_dir), "").expect("STOP file");
        self.stopping.store(true, Ordering::SeqCst);
        for slot in self.slots.iter().filter(|s| s.kind == Kind::Cli) {
            slot.signal(Signal::SIGTERM);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while tokio::time::Instant::now() < deadline
            && self
                .slots
                .iter()
                .any(|s| s.current.lock().unwrap().is_some())
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for slot in &self.slots {
            slot.signal(Signal::SIGKILL);
        }
        // Writers whose `kubectl fence` was killed run on until their time is up.
        let pids = self.run_dir.join("pids");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let live: Vec<i32> = std::fs::read_dir(&pids)
                .map(|d| {
                    d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                        .filter(|pid| kill(Pid::from_raw(*pid), None).is_ok())
                        .collect()
                })
                .unwrap_or_default();
            if live.is_empty() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                for pid in live {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for task in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
        self.record_logs().await;
        // Let the watches catch up with the last writes, then stop them.
        tokio::time::sleep(Duration::from_secs(1)).await;
        for task in self.observer.drain(..) {
            task.abort();
        }
    }

    /// Records the PostgreSQL log table and the Redis lists: each resource's own order of
    /// the writes it accepted.
    async fn record_logs(&self) {
        let pg = postgres(&self.postgres).await;
        let table = pg_table(&self.ns.name);
        let mut conn = redis::Client::open(self.redis.as_str())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to Redis");
        for (lease, _) in LEASES {
            let rows = pg
                .query(
                    &format!("SELECT id, token, coalesce(write, '') FROM {table}_log WHERE lease = $1 ORDER BY id"),
                    &[&lease],
                )
                .await
                .expect("read the PostgreSQL log");
            let entries = rows
                .iter()
                .map(|row| LogEntry {
                    seq: u64::try_from(row.get::<_, i64>(0)).unwrap_or(0),
                    token: row.get(1),
                    write: row.get(2),
                })
                .collect();
            self.runner.record(Event::ResourceLog {
                resource: Resource::Postgres,
                key: lease.into(),
                entries,
            });
            let key = redis_key(&self.ns.name, lease);
            let list: Vec<String> = redis::cmd("LRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .expect("read the Redis list");
            let entries = list
                .iter()
                .enumerate()
                .filter_map(|(i, v)| {
                    let (token, write) = v.split_once(' ')?;
                    Some(LogEntry {
                        seq: i as u64 + 1,
                        token: token.parse().ok()?,
                        write: write.into(),
                    })
                })
                .collect();
            self.runner.record(Event::ResourceLog {
                resource: Resource::Redis,
                key,
                entries,
            });
        }
    }

    /// Removes what the run left in PostgreSQL and Redis (the namespace goes with `ns`).
    pub async fn cleanup(&self) {
        let table = pg_table(&self.ns.name);
        let pg = postgres(&self.postgres).await;
        let _ = pg
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {table}_log; DROP FUNCTION IF EXISTS {table}_log();"
            ))
            .await;
        if let Ok(client) = redis::Client::open(self.redis.as_str())
            && let Ok(mut conn) = client.get_multiplexed_async_connection().await
        {
            for (lease, _) in LEASES {
                let key = redis_key(&self.ns.name, lease);
                let _: Result<(), _> = redis::cmd("DEL")
                    .arg(&key)
                    .arg(format!("{key}:fence"))
                    .query_async(&mut conn)
                    .await;
            }
        }
        for replica in &self.replicas {
            replica.signal(Signal::SIGKILL);
            let _ = std::fs::remove_file(&replica.kubeconfig);
        }
    }
}

/// A hard link to `binary` in the run directory, so that the whole run uses the binary it
/// started with, whatever rebuilds `target/` meanwhile (a long run outlasts many builds);
/// warns when the binary was not built from this source tree (a shared target directory).
/// Builds the Go library's holder (`go/internal/cmd/jepsenholder`) into the run's `bin/`, with the
/// Go toolchain `hack/control-plane` uses (it fetches one if none is installed).
fn build_go_holder(run_dir: &Path) -> PathBuf {
    let root = crate::common::repo_root();
    let out = run_dir.join("bin").join("jepsenholder");
    let status = std::process::Command::new("bash")
        .arg("-c")
        .arg(r#"PATH="$("$1/hack/control-plane" go-bin-dir):$PATH" GOTOOLCHAIN=local go build -o "$2" ./internal/cmd/jepsenholder"#)
        .args(["build-go-holder", &root.display().to_string(), &out.display().to_string()])
        .current_dir(root.join("go"))
        .status()
        .expect("run go build");
    assert!(
        status.success(),
        "go build of go/internal/cmd/jepsenholder failed ({status})"
    );
    out
}

fn pin_binary(source: PathBuf, run_dir: &Path) -> PathBuf {
    let binary = source.display();
    let dir = run_dir.join("bin");
    std::fs::create_dir_all(&dir).expect("bin dir");
    let pinned = dir.join(source.file_name().expect("a file name"));
    if std::fs::hard_link(&source, &pinned).is_err() {
        std::fs::copy(&source, &pinned).expect("copy the binary");
    }
    let ours = common::repo_root().to_str().expect("a UTF-8 path");
    let built_here = std::process::Command::new("grep")
        .args(["-qaF", ours])
        .arg(&pinned)
        .status()
        .is_ok_and(|s| s.success());
    if !built_here {
        eprintln!(
            "jepsen: WARNING: {binary} does not name {ours}: it was built from another source tree sharing the target directory"
        );
    }
    pinned
}

async fn wait_flag(flag: &AtomicBool) {
    while !flag.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn postgres(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(connection);
    client
}

/// `spec.fence` of lease `name`: its workload kind ([`FENCE_ONLY`]: Secrets, with a selector).
pub fn fence_of(name: &str) -> serde_json::Value {
    if name == FENCE_ONLY {
        collateral::fence_only_fence()
    } else {
        workload::fence_spec(name)
    }
}

/// Every lease of a run: those held, and [`FENCE_ONLY`].
pub fn all_leases() -> Vec<(&'static str, i32)> {
    LEASES.into_iter().chain([(FENCE_ONLY, 3)]).collect()
}

/// Creates (or re-creates) lease `name` with `duration`, fencing the objects labelled with it
/// and its kind ([`fence_of`]); [`FOLLOWING`] follows [`FOLLOWED`].
pub async fn create_lease(ns: &TestNamespace, name: &str, duration: i32) {
    let mut spec = serde_json::json!({
        "leaseDurationSeconds": duration,
        "fenceObjects": true,
        "fence": fence_of(name),
    });
    if name == FOLLOWING {
        spec["follow"] = serde_json::json!({"lease": FOLLOWED});
    }
    let lease: FencedLease = serde_json::from_value(serde_json::json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("lease object");
    let api = ns.api::<FencedLease>();
    for _ in 0..100 {
        match api.create(&PostParams::default(), &lease).await {
            Ok(_) => return,
            // Still being deleted (its finalizer), or the API is restarting: try again.
            Err(e) => {
                tracing_log(&format!("create lease {name}: {e}"));
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    panic!("could not create lease {name}");
}

fn tracing_log(message: &str) {
    eprintln!("jepsen: {message}");
}
