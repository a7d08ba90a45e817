//! Step 1: N leases spread over the 100 namespaces, each with one claim (no pod; made by the
//! admin), created `--concurrency` pairs at a time: how long until all are Held.

use std::time::{Duration, Instant};

use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use futures::StreamExt;
use kube::api::{Api, PostParams};

use super::Bench;
use super::calls::call;
use super::layout::{Kind, fenced_lease};
use crate::objects::claim;
use crate::{Res, fail};

impl Bench {
    /// Creates N leases and a claim for each, 32 at a time, and waits until all are Held.
    pub(super) async fn put_in_place(&mut self, n: usize, label: &str) -> Res<()> {
        let started = Instant::now();
        self.create_pairs(n, started).await?;
        let created_in = started.elapsed();
        println!(
            "created {n} leases and claims in {:.1} s ({} in flight)",
            created_in.as_secs_f64(),
            self.args.concurrency
        );
        let last_held = self.all_held(n, started).await?;
        let all_held = last_held.saturating_duration_since(started);
        println!(
            "all {n} Held {:.1} s after the first create; {}",
            all_held.as_secs_f64(),
            self.operator.proc_line()
        );
        self.out.value(
            label,
            "create leases and claims -> all Held",
            all_held.as_secs_f64(),
            "s",
            &format!(
                "{n} leases, each with one claim (no pod), created lease then claim, {} pairs in flight: created in {:.1} s; 100 namespaces, half fenceObjects, half spec.fence configmaps",
                self.args.concurrency,
                created_in.as_secs_f64()
            ),
        );
        Ok(())
    }

    /// Creates leases `l-<i>` and their claims `c-l-<i>`, `--concurrency` pairs at a time,
    /// printing the progress every 10 s.
    async fn create_pairs(&self, n: usize, started: Instant) -> Res<()> {
        let items: Vec<(String, String, Kind)> = (0..n)
            .map(|i| {
                let (ns, kind) = self.layout.place(i);
                (ns.to_string(), format!("l-{i}"), kind)
            })
            .collect();
        let (client, run) = (&self.client, &self.layout.run);
        let creates = futures::stream::iter(items)
            .map(|(ns, name, kind)| async move {
                let leases: Api<FencedLease> = Api::namespaced(client.clone(), &ns);
                let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), &ns);
                let pp = PostParams::default();
                let lease = fenced_lease(&name, kind, run)?;
                call(
                    format!("create lease {ns}/{name}"),
                    leases.create(&pp, &lease),
                )
                .await?;
                let claim = claim(&format!("c-{name}"), &name);
                call(
                    format!("create claim {ns}/c-{name}"),
                    claims.create(&pp, &claim),
                )
                .await?;
                Res::Ok(())
            })
            .buffer_unordered(self.args.concurrency);
        let mut creates = std::pin::pin!(creates);
        let mut created = 0;
        let mut next_print = Instant::now() + Duration::from_secs(10);
        while let Some(result) = creates.next().await {
            result?;
            created += 1;
            if Instant::now() >= next_print {
                next_print = Instant::now() + Duration::from_secs(10);
                let (_, held, _) = self.leases.tally("l-");
                println!(
                    "t+{:>6.1}s created {created:>6}/{n}, held {held:>6}",
                    started.elapsed().as_secs_f64()
                );
            }
        }
        Ok(())
    }

    /// Waits until the watch sees all N leases Held, printing the progress every 10 s: when
    /// the last was first seen held. Fails when the operator exits, grants none for
    /// `--stall` seconds, or not all within `--grant-timeout` of `started`.
    async fn all_held(&mut self, n: usize, started: Instant) -> Res<Instant> {
        let mut last = (0, Instant::now());
        let mut next_print = Instant::now();
        loop {
            let (seen, held, last_at) = self.leases.tally("l-");
            let now = Instant::now();
            if held != last.0 {
                last = (held, now);
            }
            if now >= next_print {
                next_print = now + Duration::from_secs(10);
                println!(
                    "t+{:>6.1}s held {held:>6}/{n} (watch sees {seen}); {}",
                    started.elapsed().as_secs_f64(),
                    self.operator.proc_line()
                );
            }
            if held >= n {
                return Ok(last_at.unwrap_or(now));
            }
            if !self.operator.alive() {
                return fail("the operator exited");
            } else if now - last.1 > Duration::from_secs(self.args.stall) {
                return fail(format!(
                    "stalled: no lease granted for {} s, {held} of {n} Held",
                    self.args.stall
                ));
            } else if started.elapsed() > Duration::from_secs(self.args.grant_timeout) {
                return fail(format!(
                    "{held} of {n} Held {} s after the first create",
                    self.args.grant_timeout
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
