//! Step 5: every lease and claim deleted (claims first, `--concurrency` at a time): how long
//! until all leases are gone, and until the admission objects are back to the baseline count.
//! And at the end of the run: what is left deleted, the operator stopped, the namespaces
//! removed.

use std::time::{Duration, Instant};

use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use futures::StreamExt;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::calls::{admission_objects, call, call_timeout, delete_quietly};
use super::{Bench, RUN_LABEL};
use crate::{Res, cluster, fail};

impl Bench {
    /// Deletes every claim, then every lease, `concurrency` at a time; waits until the leases
    /// are gone and the admission objects are back to the baseline count.
    pub(super) async fn remove(&mut self, n: usize, label: &str) -> Res<()> {
        let started = Instant::now();
        self.delete_all(n).await?;
        let sent = started.elapsed();
        let leases_gone = self.leases_gone(n, started).await?;
        let baseline = self.baseline_objects.0 + self.baseline_objects.1;
        let objects_gone = self.objects_gone(baseline, started).await?;
        println!(
            "deleted: every delete answered {:.1} s, leases gone {:.1} s, admission objects back to {baseline} {:.1} s after the first delete",
            sent.as_secs_f64(),
            leases_gone.as_secs_f64(),
            objects_gone.as_secs_f64()
        );
        self.out.value(
            label,
            "delete claims and leases -> all leases gone",
            leases_gone.as_secs_f64(),
            "s",
            &format!(
                "claims first, then leases, {} deletes in flight, the operator finalizing; every delete answered in {:.1} s",
                self.args.concurrency,
                sent.as_secs_f64()
            ),
        );
        self.out.value(
            label,
            "delete claims and leases -> admission objects back to the baseline",
            objects_gone.as_secs_f64(),
            "s",
            &format!("{baseline} ValidatingAdmissionPolicies and bindings, as before any lease"),
        );
        Ok(())
    }

    /// Deletes the claims `c-l-<i>`, then the leases `l-<i>`, `--concurrency` at a time.
    async fn delete_all(&self, n: usize) -> Res<()> {
        let (client, concurrency) = (&self.client, self.args.concurrency);
        let mut items: Vec<(bool, String, String)> = vec![];
        for i in 0..n {
            let (ns, _) = self.layout.place(i);
            items.push((true, ns.to_string(), format!("c-l-{i}")));
        }
        for i in 0..n {
            let (ns, _) = self.layout.place(i);
            items.push((false, ns.to_string(), format!("l-{i}")));
        }
        let deletes = futures::stream::iter(items)
            .map(|(is_claim, ns, name)| async move {
                if is_claim {
                    delete_quietly(
                        &Api::<FencedLeaseClaim>::namespaced(client.clone(), &ns),
                        &name,
                    )
                    .await
                } else {
                    delete_quietly(&Api::<FencedLease>::namespaced(client.clone(), &ns), &name)
                        .await
                }
            })
            .buffer_unordered(concurrency);
        let mut deletes = std::pin::pin!(deletes);
        while let Some(result) = deletes.next().await {
            result?;
        }
        Ok(())
    }

    /// Waits until the watch sees none of the N leases, printing the progress every 10 s: how
    /// long after `started`. Fails when the operator exits or none goes for `--stall` seconds.
    async fn leases_gone(&mut self, n: usize, started: Instant) -> Res<Duration> {
        let mut last = (n, Instant::now());
        let mut next_print = Instant::now() + Duration::from_secs(10);
        loop {
            let (left, _, _) = self.leases.tally("l-");
            let now = Instant::now();
            if left == 0 {
                return Ok(started.elapsed());
            }
            if left != last.0 {
                last = (left, now);
            }
            if now >= next_print {
                next_print = now + Duration::from_secs(10);
                println!(
                    "t+{:>6.1}s {left:>6} of {n} leases left; {}",
                    started.elapsed().as_secs_f64(),
                    self.operator.proc_line()
                );
            }
            if !self.operator.alive() {
                return fail("the operator exited");
            }
            if now - last.1 > Duration::from_secs(self.args.stall) {
                return fail(format!(
                    "{left} of {n} deleted leases still there, none gone for {} s",
                    self.args.stall
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until the admission objects are back to `baseline`: how long after `started`.
    /// Fails when none goes for `--stall` seconds.
    async fn objects_gone(&self, baseline: usize, started: Instant) -> Res<Duration> {
        let mut last = (usize::MAX, Instant::now());
        loop {
            let (p, b) = admission_objects(&self.client).await?;
            let now = Instant::now();
            if p + b <= baseline {
                return Ok(started.elapsed());
            }
            if p + b != last.0 {
                last = (p + b, now);
            }
            if now - last.1 > Duration::from_secs(self.args.stall) {
                return fail(format!(
                    "{} admission objects left over the {baseline} before any lease, none gone for {} s",
                    p + b - baseline,
                    self.args.stall
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Deletes the claims and then leases `made`, and waits until the leases are gone.
    pub(super) async fn remove_leases(
        &mut self,
        made: &[(String, String)],
        prefix: &str,
    ) -> Res<()> {
        for (ns, name) in made {
            let claims: Api<FencedLeaseClaim> = Api::namespaced(self.client.clone(), ns);
            delete_quietly(&claims, &format!("c-{name}")).await?;
            let leases: Api<FencedLease> = Api::namespaced(self.client.clone(), ns);
            delete_quietly(&leases, name).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(self.args.stall);
        while self.leases.tally(prefix).0 > 0 {
            if Instant::now() > deadline || !self.operator.alive() {
                return fail(format!(
                    "{} leases {prefix}* still there {} s after their deletion",
                    self.leases.tally(prefix).0,
                    self.args.stall
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Deletes what is left (the operator still running, so that it finalizes leases and
    /// removes their admission objects), stops the operator, removes the namespaces.
    pub(super) async fn finish(mut self) {
        self.delete_left().await;
        println!("{}", self.operator.log_summary());
        self.operator.stop();
        println!("operator log kept: {}", self.operator.log.display());
        if self.args.keep {
            println!("namespaces kept: {}-*", self.layout.run);
            return;
        }
        remove_namespaces(&self.client, &self.layout.all()).await;
    }

    /// Deletes the run's claims and leases left, and waits up to 10 min, while the operator
    /// runs, until the leases are gone.
    async fn delete_left(&mut self) {
        let lp = ListParams::default().labels(&format!("{RUN_LABEL}={}", self.layout.run));
        let leases: Api<FencedLease> = Api::all(self.client.clone());
        let left: Vec<(String, String)> = match call("list leases", leases.list_metadata(&lp)).await
        {
            Ok(list) => list
                .items
                .iter()
                .map(|m| (m.namespace().unwrap_or_default(), m.name_any()))
                .collect(),
            Err(e) => {
                println!("cannot list the leases left: {e}");
                vec![]
            }
        };
        if left.is_empty() {
            return;
        }
        println!("deleting the {} leases left", left.len());
        let claims: Api<FencedLeaseClaim> = Api::all(self.client.clone());
        if let Ok(list) = call("list claims", claims.list_metadata(&ListParams::default())).await {
            for m in list.items {
                let ns = m.namespace().unwrap_or_default();
                if ns.starts_with(&self.layout.run) {
                    let api: Api<FencedLeaseClaim> = Api::namespaced(self.client.clone(), &ns);
                    let _ = delete_quietly(&api, &m.name_any()).await;
                }
            }
        }
        for (ns, name) in &left {
            let api: Api<FencedLease> = Api::namespaced(self.client.clone(), ns);
            let _ = delete_quietly(&api, name).await;
        }
        let deadline = Instant::now() + Duration::from_secs(600);
        while Instant::now() < deadline && self.operator.alive() {
            match call("list leases", leases.list_metadata(&lp)).await {
                Ok(list) if list.items.is_empty() => break,
                _ => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    }
}

/// Removes the run's `namespaces` ([`cluster::remove_namespaces`], up to 15 min) and says how
/// long it took.
pub(super) async fn remove_namespaces(client: &Client, namespaces: &[String]) {
    let started = Instant::now();
    let wait = Duration::from_secs(900);
    let left = cluster::remove_namespaces(client, namespaces, call_timeout(), wait).await;
    println!(
        "removed the run's {} namespaces in {:.1} s{}",
        namespaces.len(),
        started.elapsed().as_secs_f64(),
        if left > 0 {
            format!(" ({left} still terminating)")
        } else {
            String::new()
        }
    );
}
