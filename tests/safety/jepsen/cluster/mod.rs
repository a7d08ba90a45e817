//! What a run sets up and keeps running: a namespace with the leases and the fenced objects
//! (a labelled ConfigMap, and a workload of the kind each lease fences by kind), the
//! PostgreSQL table and its log, two operator replicas (leader election on, each behind its
//! own loopback proxy so that it alone can be cut off), the holder processes (restarted when
//! they die, as a Deployment would, each as a pod of its own), and the observer that records
//! every state of the leases and of the fenced objects a watch delivers. Lease `f`
//! ([`FOLLOWING`]) is held another way: it follows coordination Lease [`FOLLOWED`], which
//! client-go leaders elect on (`jepsenholder -mode=follow`). Besides, lease `d`, which nobody
//! claims, and the collateral writer ([`crate::collateral`]).
//!
//! Here the run's start and what the nemesis asks of it; `objects` (what a run writes first),
//! `processes` (the replicas and the holders' slots, supervised), `observer`, `shutdown`.

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

mod objects;
mod observer;
mod processes;
mod shutdown;

pub use objects::{all_leases, create_lease, fence_of};
use objects::{create_leases_and_fenced_objects, create_postgres_table, slot_kinds};
pub use processes::{Kind, Replica, Slot};
use processes::{build_go_holder, pin_binary};

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

/// A grant as the observer saw it: the new holder, and how many claims wait behind it.
#[derive(Clone, Debug)]
pub struct Grant {
    pub target: Target,
    pub waiting: i32,
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

    pub fn term_of(lease: &str) -> u64 {
        LEASES
            .iter()
            .find(|(l, _)| *l == lease)
            .map_or(1, |(_, d)| u64::try_from(*d).unwrap_or(1))
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

fn tracing_log(message: &str) {
    eprintln!("jepsen: {message}");
}
