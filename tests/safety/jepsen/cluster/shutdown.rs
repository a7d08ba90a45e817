//! The end of a run: the processes stopped, their logs and the fenced resources' logs
//! recorded, the run's objects deleted.

use super::*;

impl Cluster {
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
