//! The fenced resources a holder process writes to, and how each write is recorded: its
//! attempt before it is sent, its answer (accepted, refused by a fence, or unknown) when it
//! comes. Names here are shared with the runner, which creates what they name.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fenced_lease::fence;
use fenced_lease::fence::postgres::FencedTable;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::Mutex;
use tokio::time::timeout;

use crate::history::{Event, Recorder, Resource, now};
use crate::worker::Settings;
use crate::workload;

/// Longest wait for one write's answer; past it the write's outcome is unknown.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The order a holder writes in, round after round: the workload every other round (its writes
/// are the slower ones), so that the token fences still get most of the writes.
pub const ROUNDS: [Resource; 7] = [
    Resource::Kube,
    Resource::Postgres,
    Resource::Redis,
    Resource::Workload,
    Resource::Kube,
    Resource::Postgres,
    Resource::Redis,
];

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
    /// The highest token the fence names (0 if none), and the identity rule's message.
    Refused(i64, Option<String>),
    Failed(String),
}

/// Connections to the fenced resources.
pub struct Resources {
    configmaps: Api<ConfigMap>,
    workload: workload::Writer,
    /// The next write of the workload cycle.
    workload_turn: AtomicU64,
    postgres_url: String,
    postgres: Mutex<Option<tokio_postgres::Client>>,
    table: FencedTable,
    redis: Mutex<Option<redis::aio::MultiplexedConnection>>,
    redis_url: String,
    namespace: String,
    writes: AtomicU64,
}

impl Resources {
    pub fn new(settings: &Settings, client: kube::Client) -> Self {
        let start = settings.process.bytes().fold(settings.seed, |h, b| {
            h.wrapping_mul(31).wrapping_add(u64::from(b))
        });
        Resources {
            workload: workload::Writer::new(
                client.clone(),
                &settings.namespace,
                &settings.lease,
                &settings.kubeconfig,
                &settings.kubectl,
                &settings.process,
            ),
            workload_turn: AtomicU64::new(start % 1_000),
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

    /// Makes the next workload write one through `kubectl`, or through the Rust client (no
    /// process to start).
    pub fn next_workload_write_by(&self, kubectl: bool) {
        while workload::by_kubectl(self.workload_turn.load(Ordering::Relaxed)) != kubectl {
            self.workload_turn.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Writes `token` to `resource` for `lease` (a workload: the next write of its cycle, as
    /// the holder of `token`), recording the attempt and its outcome. Returns whether a fence
    /// refused it.
    pub async fn write(&self, rec: &Recorder, resource: Resource, lease: &str, token: i64) -> bool {
        let n = self.writes.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}#{n}", rec.process());
        let turn = self.workload_turn.load(Ordering::Relaxed);
        let (key, how) = match resource {
            Resource::Kube => (config_map_name(lease), None),
            Resource::Postgres => (lease.to_string(), None),
            Resource::Redis => (redis_key(&self.namespace, lease), None),
            Resource::Workload => {
                self.workload_turn.fetch_add(1, Ordering::Relaxed);
                let (key, how) = self.workload.describe(lease, turn);
                (key, Some(how))
            }
            Resource::Unfenced => unreachable!("holders write only what their lease fences"),
        };
        rec.record(Event::WriteAttempt {
            id: id.clone(),
            resource,
            key: key.clone(),
            lease: lease.into(),
            token,
            how,
        });
        let send = self.send(resource, &key, lease, (token, turn), &id);
        let outcome = match timeout(WRITE_TIMEOUT, send).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome::Failed(format!("no answer within {WRITE_TIMEOUT:?}")),
        };
        let t = now();
        match outcome {
            Outcome::Accepted(seq) => {
                rec.record_at(t, Event::WriteAccepted { id, seq });
                false
            }
            Outcome::Refused(highest, not_holder) => {
                rec.record_at(
                    t,
                    Event::WriteRefused {
                        id,
                        highest,
                        not_holder,
                        refusal: None,
                    },
                );
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
        (token, turn): (i64, u64),
        id: &str,
    ) -> Outcome {
        let fenced = |e: fence::Error| match e {
            fence::Error::Fenced { highest, .. } => Outcome::Refused(highest, None),
            fence::Error::NotHolder(what) => Outcome::Refused(0, Some(what)),
            other => Outcome::Failed(other.to_string()),
        };
        match resource {
            Resource::Unfenced => unreachable!("holders write only what their lease fences"),
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
            Resource::Workload => match self.workload.send(lease, turn, id).await {
                workload::Answer::Accepted => Outcome::Accepted(None),
                workload::Answer::Refused(what, highest) => Outcome::Refused(highest, Some(what)),
                workload::Answer::Failed(error) => Outcome::Failed(error),
            },
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
