//! Step 3: with every lease held, the holders heartbeat at `--beat-rate`: operator CPU seconds
//! per 1,000 heartbeats, resident memory, apiserver writes per second and per heartbeat.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fenced_lease::api::FencedLeaseClaim;
use futures::StreamExt;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use super::{Profile, print_writes};
use crate::Res;
use crate::apiserver::{apiserver_writes, diff, top_writes, total};
use crate::objects::beat;
use crate::operator::Operator;
use crate::procfs::{cpu_seconds, rss_mib};

/// The holders' heartbeats, driven in a task of their own until [`Driver::stop`].
pub(super) struct Driver {
    beats: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Driver {
    /// Heartbeats the claims `c-<name>` of `names` round-robin at `--beat-rate` per second,
    /// `--concurrency` at a time.
    pub(super) fn start(p: &Profile<'_>, names: &[String]) -> Self {
        let claims: Api<FencedLeaseClaim> = Api::namespaced(p.client.clone(), p.ns);
        let (beats, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let stop = CancellationToken::new();
        let task = tokio::spawn(heartbeat(
            claims,
            names.to_vec(),
            (p.args.beat_rate, p.args.concurrency),
            (beats.clone(), errors.clone()),
            stop.clone(),
        ));
        Driver {
            beats,
            errors,
            stop,
            task,
        }
    }

    pub(super) async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Heartbeats `c-<name>` of `names` round-robin at `rate` per second, `concurrency` at a time,
/// counting `beats` and `errors`, until `stop`.
async fn heartbeat(
    claims: Api<FencedLeaseClaim>,
    names: Vec<String>,
    (rate, concurrency): (f64, usize),
    (beats, errors): (Arc<AtomicU64>, Arc<AtomicU64>),
    stop: CancellationToken,
) {
    let started = Instant::now();
    let ticks = futures::stream::iter(0u64..).then(move |i| async move {
        let at = started + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(at.into()).await;
        i
    });
    let work = ticks
        .map(|i| {
            let (claims, beats, errors) = (&claims, &beats, &errors);
            let name = format!("c-{}", names[(i as usize) % names.len()]);
            async move {
                match beat(claims, &name).await {
                    Ok(()) => beats.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
        .buffer_unordered(concurrency)
        .for_each(|_| async {});
    tokio::select! {
        () = work => {}
        () = stop.cancelled() => {}
    }
}

/// Once the rate has settled, the figures over `--beat-seconds` of heartbeats.
pub(super) async fn figures(p: &Profile<'_>, operator: &Operator, driver: &Driver) -> Res<()> {
    tokio::time::sleep(Duration::from_secs(2)).await; // the rate settles
    let (b0, cpu0, w0, t0) = (
        driver.beats.load(Ordering::Relaxed),
        cpu_seconds(operator.pid),
        apiserver_writes(p.client).await?,
        Instant::now(),
    );
    tokio::time::sleep(Duration::from_secs(p.args.beat_seconds)).await;
    let (b1, cpu1, w1, t1) = (
        driver.beats.load(Ordering::Relaxed),
        cpu_seconds(operator.pid),
        apiserver_writes(p.client).await?,
        Instant::now(),
    );
    let window = (t1 - t0).as_secs_f64();
    let beaten = (b1 - b0) as f64;
    let writes = diff(&w0, &w1);
    let writes_total = total(&writes);
    let cpu_per_1000 = (cpu1 - cpu0) / (beaten / 1000.0).max(0.001);
    let rss_beating = rss_mib(operator.pid);
    println!(
        "heartbeats: {:.0}/s over {window:.0} s ({} failed); operator CPU {:.2} s = {cpu_per_1000:.2} s per 1,000 heartbeats; apiserver writes {:.0}/s = {:.2} per heartbeat; RSS {rss_beating:.1} MiB",
        beaten / window,
        driver.errors.load(Ordering::Relaxed),
        cpu1 - cpu0,
        writes_total / window,
        writes_total / beaten.max(1.0)
    );
    print_writes(&writes, beaten);
    let note = format!("{window:.0} s window");
    p.value("heartbeats/s driven", beaten / window, "/s", &note);
    p.value("operator CPU s per 1,000 heartbeats", cpu_per_1000, "s", "");
    let rate = writes_total / window;
    p.value("apiserver writes/s while heartbeating", rate, "/s", "");
    p.value(
        "apiserver writes per heartbeat",
        writes_total / beaten.max(1.0),
        "",
        &top_writes(&writes, beaten.max(1.0), 4),
    );
    p.value("RSS while heartbeating", rss_beating, "MiB", "");
    Ok(())
}
