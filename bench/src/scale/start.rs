//! Step 2: the operator starts over the waiting claims. How fast does it grant them all, and
//! does a fresh claim in another namespace get its grant meanwhile? Fails when no claim is
//! granted for `--stall` seconds or not all within `--grant-timeout`, with the operator's state.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use kube::api::{Api, PostParams};

use super::{Profile, print_writes};
use crate::apiserver::{apiserver_writes, diff, top_writes, total};
use crate::figures::ms;
use crate::grants::{Grants, failure_report};
use crate::objects::{claim, lease};
use crate::operator::Operator;
use crate::procfs::{fds, listen_overflows, peak_rss_mib, rss_mib};
use crate::{Res, fail};

/// The operator running over the profile's leases, and the watch on the grants.
pub(super) struct Started {
    pub(super) operator: Operator,
    pub(super) grants: Grants,
    /// The operator's log.
    pub(super) log: PathBuf,
}

impl Started {
    /// Fails with `what`, after printing the failure report of `namespaces`.
    pub(super) async fn failed<T>(
        &self,
        p: &Profile<'_>,
        namespaces: &[&str],
        what: String,
    ) -> Res<T> {
        let report = failure_report(p.client, &self.operator, namespaces, &self.grants).await;
        println!("{report}");
        fail(format!("{what} (log: {})", self.log.display()))
    }

    /// Prints the operator's figures and log summary, stops it, and says where its log is.
    pub(super) fn finish(mut self) {
        println!("{}", self.operator.proc_line());
        println!("{}", self.operator.log_summary());
        self.operator.stop();
        let size = std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        println!(
            "operator log kept: {} ({:.1} MiB)",
            self.log.display(),
            size as f64 / 1048576.0
        );
    }
}

/// The probe: a lease and its claim in another namespace, 3 s after the start; how long the
/// claim took to be granted.
type Probe = tokio::task::JoinHandle<Res<Res<Duration>>>;

/// Starts the operator over the leases, waits until all are granted, and adds the figures.
pub(super) async fn grant_all(p: &Profile<'_>) -> Res<Started> {
    let grants = Grants::watch(p.client, None);
    grants.synced().await;
    let (n, run, ns) = (p.n, p.run, p.ns);
    let log = p.args.log_dir.join(format!("scale-{n}-run{run}-{ns}.log"));
    let writes_before = apiserver_writes(p.client).await?;
    let overflows_before = listen_overflows();
    let operator = Operator::start(&p.args.operator, None, ns, &log, &p.args.rust_log)?;
    println!(
        "operator pid {} started over them, log {}",
        operator.pid,
        log.display()
    );
    let mut started = Started {
        operator,
        grants,
        log,
    };
    let probe = spawn_probe(p, &started.grants);
    let peak_sockets = match wait_granted(p, &mut started).await {
        Ok(peak) => peak,
        Err(why) => return stalled(p, started, overflows_before, probe, why).await,
    };
    let granted = Granted::now(p, &started);
    let overflows = listen_overflows() - overflows_before;
    println!(
        "connections dropped by full accept queues while granting (kernel ListenOverflows): {overflows}"
    );
    let start_writes = diff(&writes_before, &apiserver_writes(p.client).await?);
    println!("apiserver writes while granting (per grant):");
    print_writes(&start_writes, n as f64);
    let probe = match probe.await {
        Ok(Ok(Ok(d))) => format!("{:.0} ms", ms(d)),
        Ok(Ok(Err(e))) => format!("not granted: {e}"),
        other => format!("probe failed: {:?}", other.err()),
    };
    granted.report(p, peak_sockets, overflows, &start_writes, &probe);
    Ok(started)
}

fn spawn_probe(p: &Profile<'_>, grants: &Grants) -> Probe {
    let (client, probe_ns, grants) = (p.client.clone(), p.probe_ns.to_string(), grants.clone());
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let leases: Api<FencedLease> = Api::namespaced(client.clone(), &probe_ns);
        let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), &probe_ns);
        let pp = PostParams::default();
        leases.create(&pp, &lease("probe", 3600)).await?;
        let at = Instant::now();
        claims.create(&pp, &claim("probe", "probe")).await?;
        let granted = grants
            .wait(&probe_ns, "probe", Duration::from_secs(20))
            .await;
        Res::Ok(granted.map(|g| g - at))
    })
}

/// Waits until the watch sees every claim granted, printing the progress: the most sockets
/// the operator held meanwhile. Why not, when the operator exited, stalled or ran out of time.
async fn wait_granted(p: &Profile<'_>, started: &mut Started) -> Result<usize, String> {
    let (args, n) = (p.args, p.n);
    let operator = &mut started.operator;
    let start = operator.started;
    let mut peak_sockets = 0;
    let mut last_count = 0;
    let mut last_change = Instant::now();
    let mut next_print = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (count, _, _) = started.grants.granted_in(p.ns);
        let now = Instant::now();
        peak_sockets = peak_sockets.max(fds(operator.pid).1);
        if count != last_count {
            last_count = count;
            last_change = now;
        }
        if now >= next_print || count == n {
            next_print = now + Duration::from_secs(5);
            println!(
                "t+{:>5.1}s granted {count:>6}/{n}  {}",
                start.elapsed().as_secs_f64(),
                operator.proc_line()
            );
        }
        if count >= n {
            return Ok(peak_sockets);
        }
        if !operator.alive() {
            return Err("the operator exited".to_string());
        } else if now - last_change > Duration::from_secs(args.stall) {
            return Err(format!(
                "stalled: no grant for {} s with {count} of {n} granted",
                args.stall
            ));
        } else if start.elapsed() > Duration::from_secs(args.grant_timeout) {
            return Err(format!(
                "{count} of {n} granted after {} s",
                args.grant_timeout
            ));
        }
    }
}

/// Not all granted: the operator's state, the probe's fate, and the failure.
async fn stalled(
    p: &Profile<'_>,
    mut started: Started,
    overflows_before: u64,
    probe: Probe,
    why: String,
) -> Res<Started> {
    let namespaces = [p.ns, p.probe_ns];
    let report = failure_report(p.client, &started.operator, &namespaces, &started.grants).await;
    started.operator.stop();
    println!("{report}");
    println!(
        "connections dropped by full accept queues since the start (kernel ListenOverflows): {}",
        listen_overflows() - overflows_before
    );
    let probe = probe.await.ok().and_then(|p| p.ok()).map(|p| {
        p.map(|d| format!("{:.0} ms", ms(d)))
            .unwrap_or_else(|e| e.to_string())
    });
    println!("probe claim in another namespace: {probe:?}");
    let log = started.log.display();
    println!("the operator's log is kept: {log}");
    fail(format!("{why} (log: {log})"))
}

/// The figures of the start, taken once every claim is granted.
struct Granted {
    grants_per_s: f64,
    /// Seconds from the operator's start to the last grant, and to the first.
    since_start: f64,
    first_at: f64,
    /// The operator's resident memory, MiB: now, and its peak so far.
    rss: f64,
    peak: f64,
}

impl Granted {
    fn now(p: &Profile<'_>, started: &Started) -> Self {
        let operator = &started.operator;
        let times = started.grants.grant_times(p.ns);
        let first = times.iter().min().copied().unwrap_or(operator.started);
        let last = times.iter().max().copied().unwrap_or(operator.started);
        Granted {
            grants_per_s: p.n as f64 / (last - first).as_secs_f64().max(0.001),
            since_start: (last - operator.started).as_secs_f64(),
            first_at: (first - operator.started).as_secs_f64(),
            rss: rss_mib(operator.pid),
            peak: peak_rss_mib(operator.pid),
        }
    }

    /// Prints them and adds their rows: grants/s, RSS, connections, apiserver writes per grant.
    fn report(
        &self,
        p: &Profile<'_>,
        peak_sockets: usize,
        overflows: u64,
        start_writes: &BTreeMap<String, f64>,
        probe: &str,
    ) {
        let n = p.n;
        let Granted {
            grants_per_s,
            since_start,
            first_at,
            rss,
            peak,
        } = self;
        println!(
            "all {n} granted {since_start:.1} s after the operator started (first grant at {first_at:.1} s): {grants_per_s:.0} grants/s; RSS {rss:.1} MiB (peak {peak:.1}); probe claim in another namespace granted in {probe}"
        );
        p.value(
            "grants/s, start over waiting claims",
            *grants_per_s,
            "/s",
            &format!(
                "all granted {since_start:.1} s after start; first grant at {first_at:.1} s; probe in another namespace: {probe}"
            ),
        );
        let peak_note = format!("peak {peak:.1} MiB");
        p.value("RSS right after granting all", *rss, "MiB", &peak_note);
        p.value(
            "operator connections at the start (peak)",
            peak_sockets as f64,
            "",
            &format!(
                "sockets in /proc/<pid>/fd; {overflows} connects dropped by full accept queues"
            ),
        );
        p.value(
            "apiserver writes per grant at the start",
            total(start_writes) / n as f64,
            "",
            &top_writes(start_writes, (n as f64).max(1.0), 4),
        );
    }
}
