//! The operator at scale, one size after another (default 1,000, 5,000 and 10,000 leases):
//!
//! 1. N leases, each with one waiting claim, are created while no operator runs (an outage);
//! 2. the operator starts over them: how fast does it grant them all (grants/s), and does a
//!    fresh claim in another namespace get its grant meanwhile? If no claim is granted for
//!    `--stall` seconds, or all are not granted within `--grant-timeout`, the program fails
//!    and prints the operator's state (claims by phase, its metrics, its log's warnings) and
//!    where its log is;
//! 3. with every lease held, the holders heartbeat at `--beat-rate`: operator CPU seconds per
//!    1,000 heartbeats, resident memory, apiserver writes per second and per heartbeat
//!    (the apiserver's `apiserver_request_total`), and how late expiries fire meanwhile;
//! 4. every lease and claim is deleted, 32 at a time, the operator running: how fast are the
//!    leases finalized, and does a new claim in another namespace get its grant meanwhile?
//!    Fails when no lease goes for 60 s.
//!
//! ```console
//! $ eval "$(hack/control-plane up)"
//! $ cargo build --release --bin fenced-lease-operator
//! $ cargo run --release --bin bench-scale -- --sizes 1000 --operator target/release/fenced-lease-operator
//! ```

use fenced_lease_bench::common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use common::*;
use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

/// The operator at 1,000 / 5,000 / 10,000 leases: grants after an outage, heartbeats, expiry.
#[derive(Parser)]
struct Args {
    /// The operator binary to measure.
    #[arg(long, default_value = "target/release/fenced-lease-operator")]
    operator: PathBuf,
    /// Numbers of leases (each with one claim), one profile each.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000")]
    sizes: Vec<usize>,
    /// Repeat each size this many times.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Fail when no claim was granted for this long while some still wait (seconds).
    #[arg(long, default_value_t = 60)]
    stall: u64,
    /// Fail when not every claim is granted within this long after the start (seconds).
    #[arg(long, default_value_t = 600)]
    grant_timeout: u64,
    /// Heartbeats per second across all holders (about half the apiserver's raw write rate
    /// leaves room for the operator's own writes).
    #[arg(long, default_value_t = 100.0)]
    beat_rate: f64,
    /// Seconds of the heartbeat window the figures are taken over.
    #[arg(long, default_value_t = 30)]
    beat_seconds: u64,
    /// Leases whose holder stops heartbeating, for the expiry lateness (lease duration 2 s);
    /// created first, then their holders queued 50 ms apart, each with a waiter behind it, so
    /// their expiries come one at a time, as independent holders' do.
    #[arg(long, default_value_t = 100)]
    expiries: usize,
    /// Requests in flight while creating objects and heartbeating.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// The operator's RUST_LOG.
    #[arg(long, default_value = "info")]
    rust_log: String,
    /// Directory for the operator's logs.
    #[arg(long, default_value = "/tmp/fenced-lease-bench")]
    log_dir: PathBuf,
    /// Append result rows here (tab-separated; hack/bench renders them).
    #[arg(long)]
    results: Option<PathBuf>,
    /// Leave the namespaces in place (for a look at them afterwards).
    #[arg(long)]
    keep: bool,
    /// Give every claim a pod of its own, created with the leases (a Deployment's labels; no
    /// kubelet runs them), and have the leases annotate their holder's pod, as for holders
    /// in pods: the operator then caches N pods too and writes each holder's token annotation.
    #[arg(long)]
    pods: bool,
    /// Instead: create each lease and then its claim, one after the other, while the
    /// operator runs (as a growing user does); only the grants and memory are measured.
    #[arg(long)]
    live: bool,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let results = Results::new(args.results.clone());
    let client = match client().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("bench_scale: {e}");
            std::process::exit(2);
        }
    };
    let _ = std::fs::create_dir_all(&args.log_dir);
    let mut failed = 0;
    for &n in &args.sizes {
        for run in 1..=args.repeat {
            println!("== {n} leases, run {run} of {} ==", args.repeat);
            match profile(&client, &args, &results, n, run).await {
                Ok(()) => {}
                Err(e) => {
                    failed += 1;
                    println!("FAILED: {n} leases, run {run}: {e}");
                    results.value(
                        "scale",
                        "fenced-lease",
                        &format!("N={n}: run FAILED"),
                        0.0,
                        "",
                        e.to_string().lines().next().unwrap_or(""),
                    );
                }
            }
        }
    }
    if failed > 0 {
        std::process::exit(1);
    }
}

async fn profile(client: &Client, args: &Args, results: &Results, n: usize, run: usize) -> Res<()> {
    let ns = namespace(client, "scale").await?;
    let probe_ns = namespace(client, "probe").await?;
    let outcome = measure(client, args, results, n, run, &ns, &probe_ns).await;
    if !args.keep {
        let started = Instant::now();
        cleanup(client, &probe_ns).await;
        cleanup(client, &ns).await;
        println!(
            "cleaned up {ns} and {probe_ns} in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    outcome
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    client: &Client,
    args: &Args,
    results: &Results,
    n: usize,
    run: usize,
    ns: &str,
    probe_ns: &str,
) -> Res<()> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), ns);
    let section = "scale";
    let sys = "fenced-lease";

    // 1. The outage: leases and claims created while no operator runs.
    let names: Vec<String> = (0..n).map(|i| format!("l-{i}")).collect();
    if args.live {
        return live(client, args, results, n, run, ns, &names).await;
    }
    let took_pods = if args.pods {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        create_all(
            &pods,
            names.iter().map(|l| pod(&format!("p-{l}"))).collect(),
            args.concurrency,
        )
        .await?
    } else {
        Duration::ZERO
    };
    let took = create_all(
        &leases,
        names
            .iter()
            .map(|l| {
                let mut lease = lease(l, 3600);
                lease.spec.annotate_holder_pod = args.pods;
                lease
            })
            .collect(),
        args.concurrency,
    )
    .await?;
    let took_claims = create_all(
        &claims,
        names
            .iter()
            .map(|l| {
                let mut claim = claim(&format!("c-{l}"), l);
                claim.spec.pod_name = args.pods.then(|| format!("p-{l}"));
                claim
            })
            .collect(),
        args.concurrency,
    )
    .await?;
    let objects = if args.pods { 3 * n } else { 2 * n };
    let took_all = took + took_claims + took_pods;
    let create_rate = objects as f64 / took_all.as_secs_f64();
    println!(
        "created {n} leases, {n} claims{} in {:.1} s ({create_rate:.0} creates/s, {} in flight), no operator running",
        if args.pods {
            format!(" and {n} pods")
        } else {
            String::new()
        },
        took_all.as_secs_f64(),
        args.concurrency
    );

    // 2. The operator starts over them.
    let grants = Grants::watch(client, None);
    grants.synced().await;
    let log = args.log_dir.join(format!("scale-{n}-run{run}-{ns}.log"));
    let writes_before = apiserver_writes(client).await?;
    let overflows_before = listen_overflows();
    let mut operator = Operator::start(&args.operator, None, ns, &log, &args.rust_log)?;
    let mut peak_sockets = 0;
    println!(
        "operator pid {} started over them, log {}",
        operator.pid,
        log.display()
    );
    let started = operator.started;

    let probe = {
        let (client, probe_ns, grants) = (client.clone(), probe_ns.to_string(), grants.clone());
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
    };

    let mut last_count = 0;
    let mut last_change = Instant::now();
    let mut next_print = Instant::now();
    let mut progress: Vec<String> = vec![];
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (count, _, _) = grants.granted_in(ns);
        let now = Instant::now();
        peak_sockets = peak_sockets.max(fds(operator.pid).1);
        if count != last_count {
            last_count = count;
            last_change = now;
        }
        if now >= next_print || count == n {
            next_print = now + Duration::from_secs(5);
            let line = format!(
                "t+{:>5.1}s granted {count:>6}/{n}  {}",
                started.elapsed().as_secs_f64(),
                operator.proc_line()
            );
            println!("{line}");
            progress.push(line);
        }
        if count >= n {
            break;
        }
        let why = if !operator.alive() {
            Some("the operator exited".to_string())
        } else if now - last_change > Duration::from_secs(args.stall) {
            Some(format!(
                "stalled: no grant for {} s with {count} of {n} granted",
                args.stall
            ))
        } else if started.elapsed() > Duration::from_secs(args.grant_timeout) {
            Some(format!(
                "{count} of {n} granted after {} s",
                args.grant_timeout
            ))
        } else {
            None
        };
        if let Some(why) = why {
            let report = failure_report(client, &operator, &[ns, probe_ns], &grants).await;
            operator.stop();
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
            println!("the operator's log is kept: {}", log.display());
            return fail(format!("{why} (log: {})", log.display()));
        }
    }
    let times = grants.grant_times(ns);
    let first = times.iter().min().copied().unwrap_or(started);
    let last = times.iter().max().copied().unwrap_or(started);
    let grants_per_s = n as f64 / (last - first).as_secs_f64().max(0.001);
    let since_start = (last - started).as_secs_f64();
    let rss_granted = rss_mib(operator.pid);
    let peak = peak_rss_mib(operator.pid);
    let overflows = listen_overflows() - overflows_before;
    println!(
        "connections dropped by full accept queues while granting (kernel ListenOverflows): {overflows}"
    );
    let start_writes = diff(&writes_before, &apiserver_writes(client).await?);
    println!("apiserver writes while granting (per grant):");
    print_writes(&start_writes, n as f64);
    let probe = match probe.await {
        Ok(Ok(Ok(d))) => format!("{:.0} ms", ms(d)),
        Ok(Ok(Err(e))) => format!("not granted: {e}"),
        other => format!("probe failed: {:?}", other.err()),
    };
    println!(
        "all {n} granted {since_start:.1} s after the operator started (first grant at {:.1} s): {grants_per_s:.0} grants/s; RSS {rss_granted:.1} MiB (peak {peak:.1}); probe claim in another namespace granted in {probe}",
        (first - started).as_secs_f64()
    );
    results.value(section, sys, &format!("N={n}: grants/s, start over waiting claims"), grants_per_s, "/s", &format!("all granted {since_start:.1} s after start; first grant at {:.1} s; probe in another namespace: {probe}", (first - started).as_secs_f64()));
    results.value(
        section,
        sys,
        &format!("N={n}: RSS right after granting all"),
        rss_granted,
        "MiB",
        &format!("peak {peak:.1} MiB"),
    );
    results.value(
        section,
        sys,
        &format!("N={n}: operator connections at the start (peak)"),
        peak_sockets as f64,
        "",
        &format!("sockets in /proc/<pid>/fd; {overflows} connects dropped by full accept queues"),
    );
    results.value(
        section,
        sys,
        &format!("N={n}: apiserver writes per grant at the start"),
        total(&start_writes) / n as f64,
        "",
        &top_writes(&start_writes, n as f64),
    );

    // 3. Heartbeats.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let beats = Arc::new(AtomicU64::new(0));
    let beat_errors = Arc::new(AtomicU64::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let driver = tokio::spawn(heartbeat(
        claims.clone(),
        names.clone(),
        args.beat_rate,
        args.concurrency,
        beats.clone(),
        beat_errors.clone(),
        stop.clone(),
    ));

    tokio::time::sleep(Duration::from_secs(2)).await; // the rate settles
    let (b0, cpu0, w0, t0) = (
        beats.load(Ordering::Relaxed),
        cpu_seconds(operator.pid),
        apiserver_writes(client).await?,
        Instant::now(),
    );
    tokio::time::sleep(Duration::from_secs(args.beat_seconds)).await;
    let (b1, cpu1, w1, t1) = (
        beats.load(Ordering::Relaxed),
        cpu_seconds(operator.pid),
        apiserver_writes(client).await?,
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
        beat_errors.load(Ordering::Relaxed),
        cpu1 - cpu0,
        writes_total / window,
        writes_total / beaten.max(1.0)
    );
    print_writes(&writes, beaten);
    results.value(
        section,
        sys,
        &format!("N={n}: heartbeats/s driven"),
        beaten / window,
        "/s",
        &format!("{window:.0} s window"),
    );
    results.value(
        section,
        sys,
        &format!("N={n}: operator CPU s per 1,000 heartbeats"),
        cpu_per_1000,
        "s",
        "",
    );
    results.value(
        section,
        sys,
        &format!("N={n}: apiserver writes/s while heartbeating"),
        writes_total / window,
        "/s",
        "",
    );
    results.value(
        section,
        sys,
        &format!("N={n}: apiserver writes per heartbeat"),
        writes_total / beaten.max(1.0),
        "",
        &top_writes(&writes, beaten),
    );
    results.value(
        section,
        sys,
        &format!("N={n}: RSS while heartbeating"),
        rss_beating,
        "MiB",
        "",
    );

    // Expiry while the heartbeats go on: holders that never beat, waiters that do.
    let lateness = expiries(client, ns, &grants, args.expiries).await;
    stop.cancel();
    let _ = driver.await;
    match lateness {
        Ok(outcomes) => {
            let samples: Vec<f64> = outcomes.iter().flatten().copied().collect();
            let skipped = outcomes.len() - samples.len();
            results.samples(
                section,
                sys,
                &format!("N={n}: expiry lateness"),
                &samples,
                "ms",
                &format!("the waiter's grant after the silent holder's grant + 2 s, by the operator's clock (its term counts from first sight of the claim, a little before the grant), heartbeats running; holders queued 50 ms apart on leases created before; {skipped} of {} holders expired before they were granted (the operator a whole term behind), not counted", outcomes.len()),
            )
        }
        Err(e) => {
            let report = failure_report(client, &operator, &[ns], &grants).await;
            println!("{report}");
            return fail(format!("expiry: {e} (log: {})", log.display()));
        }
    }

    // 4. Every lease and claim deleted at once (as with their namespace), the operator running.
    match deletion(client, ns, probe_ns, &grants, args.concurrency, &operator).await {
        Ok((per_s, took, probe)) => {
            let probe = probe
                .map(|d| format!("{:.0} ms", ms(d)))
                .unwrap_or_else(|e| format!("not granted: {e}"));
            println!(
                "deleted every lease and claim: all leases gone {:.1} s after the first delete ({per_s:.0} leases/s); a new claim in another namespace meanwhile granted in {probe}; {}",
                took.as_secs_f64(),
                operator.proc_line()
            );
            results.value(
                section,
                sys,
                &format!("N={n}: leases finalized/s, all deleted at once"),
                per_s,
                "/s",
                &format!(
                    "{n} leases and their claims deleted, {} at a time: all gone in {:.1} s; a new claim in another namespace meanwhile granted in {probe}",
                    args.concurrency,
                    took.as_secs_f64()
                ),
            );
        }
        Err(e) => {
            let report = failure_report(client, &operator, &[ns, probe_ns], &grants).await;
            println!("{report}");
            return fail(format!("deletion: {e} (log: {})", log.display()));
        }
    }
    println!("{}", operator.proc_line());
    println!("{}", operator.log_summary());
    operator.stop();
    let size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    println!(
        "operator log kept: {} ({:.1} MiB)",
        log.display(),
        size as f64 / 1048576.0
    );
    Ok(())
}

/// Deletes every lease and claim of `ns`, `concurrency` at a time, and meanwhile asks for a
/// new lease in `probe_ns`: how fast does the operator finalize the leases, and does the new
/// claim still get its lease at once? Fails when the leases stop going for 60 s.
async fn deletion(
    client: &Client,
    ns: &str,
    probe_ns: &str,
    grants: &Grants,
    concurrency: usize,
    operator: &Operator,
) -> Res<(f64, Duration, Res<Duration>)> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), ns);
    let (lease_names, claim_names) = (names(&leases).await?, names(&claims).await?);
    let total = lease_names.len();
    let probe = {
        let (client, probe_ns, grants) = (client.clone(), probe_ns.to_string(), grants.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let pp = PostParams::default();
            Api::<FencedLease>::namespaced(client.clone(), &probe_ns)
                .create(&pp, &lease("during-deletion", 3600))
                .await?;
            let at = Instant::now();
            Api::<FencedLeaseClaim>::namespaced(client, &probe_ns)
                .create(&pp, &claim("during-deletion", "during-deletion"))
                .await?;
            let granted = grants
                .wait(&probe_ns, "during-deletion", Duration::from_secs(30))
                .await?;
            Res::Ok(granted - at)
        })
    };
    let started = Instant::now();
    let dp = DeleteParams::default();
    let deletes = claim_names
        .iter()
        .map(|c| (true, c))
        .chain(lease_names.iter().map(|l| (false, l)));
    futures::stream::iter(deletes)
        .for_each_concurrent(concurrency, |(is_claim, name)| {
            let (leases, claims, dp) = (&leases, &claims, &dp);
            async move {
                let _ = if is_claim {
                    claims.delete(name, dp).await.map(drop)
                } else {
                    leases.delete(name, dp).await.map(drop)
                };
            }
        })
        .await;
    let mut left = total;
    let mut last_change = Instant::now();
    while left > 0 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = leases
            .list_metadata(&ListParams::default())
            .await?
            .items
            .len();
        if now != left {
            left = now;
            last_change = Instant::now();
        } else if last_change.elapsed() > Duration::from_secs(60) {
            return fail(format!(
                "{left} of {total} deleted leases still there, none gone for 60 s; {}",
                operator.proc_line()
            ));
        }
    }
    let took = started.elapsed();
    let probe = match probe.await {
        Ok(result) => result,
        Err(e) => fail(format!("probe task: {e}")),
    };
    Ok((total as f64 / took.as_secs_f64(), took, probe))
}

/// The names of every object `api` lists.
async fn names<K>(api: &Api<K>) -> Res<Vec<String>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api.list_metadata(&ListParams::default()).await?;
    Ok(list.items.iter().map(|o| o.name_any()).collect())
}

/// Heartbeats the claims named `c-<name>` round-robin at `rate` per second until `stop`.
#[allow(clippy::too_many_arguments)]
async fn heartbeat(
    claims: Api<FencedLeaseClaim>,
    names: Vec<String>,
    rate: f64,
    concurrency: usize,
    beats: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    stop: tokio_util::sync::CancellationToken,
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

/// How far apart the expiry leases' holders start: 20 expiries a second, one at a time, as
/// independent holders' are, on leases created before. At 15 ms apart (67 a second, each
/// costing ~5 writes, besides ~150 waiter heartbeats a second) the apiserver of this 2-core
/// machine was past its write rate, and the lateness measured its backlog; at 25 ms with the
/// leases created meanwhile, the first expiries fell into this bench's own burst of creates.
const EXPIRY_STAGGER: Duration = Duration::from_millis(50);

/// `count` leases of 2 s whose holder never beats and whose waiter does: how long after the
/// holder's term does the waiter get the lease?
/// One outcome per lease: the lateness, or `None` when the holder was expired before it was
/// granted (skipped as a silent waiter: the operator was a whole term behind).
async fn expiries(
    client: &Client,
    ns: &str,
    grants: &Grants,
    count: usize,
) -> Res<Vec<Option<f64>>> {
    const DURATION: Duration = Duration::from_secs(2);
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    // The leases first, all of them: each takes the operator a finalizer and a status write.
    let names: Vec<String> = (0..count).map(|i| format!("exp-{i}")).collect();
    create_all(&leases, names.iter().map(|l| lease(l, 2)).collect(), 8).await?;
    let settled = Instant::now() + Duration::from_secs(30);
    while Instant::now() < settled {
        let list = leases.list(&ListParams::default()).await?;
        let ready = list
            .items
            .iter()
            .filter(|l| names.contains(&l.name_any()) && l.status.is_some())
            .count();
        if ready == count {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let tasks = names.into_iter().enumerate().map(|(i, l)| {
        let (claims, pp, grants) = (claims.clone(), pp.clone(), grants.clone());
        async move {
            tokio::time::sleep(EXPIRY_STAGGER * i as u32).await;
            claims
                .create(&pp, &claim(&format!("{l}-a-holder"), &l))
                .await?;
            // Queued right behind the holder (FIFO: creation time, then name), not once this
            // bench's watch shows the grant: that watch can lag past the holder's term.
            let waiter = format!("{l}-b-waiter");
            claims.create(&pp, &claim(&waiter, &l)).await?;
            // It beats from its creation on, as a library candidate does while it waits: a
            // waiter silent for a whole term is skipped at the hand-over.
            let held = Instant::now();
            let mut last_beat = Instant::now();
            loop {
                if grants.granted_at(ns, &waiter).is_some() {
                    // From the operator's own timestamps (its grant times of the two claims),
                    // not from when this bench's watch saw them: right after thousands of
                    // grants that watch lags by hundreds of ms.
                    let granted = |name: String| {
                        let claims = claims.clone();
                        async move {
                            let claim = claims.get(&name).await?;
                            Res::Ok(claim.status.and_then(|s| s.grant_time).map(|t| t.0))
                        }
                    };
                    let Some(first) = granted(format!("{l}-a-holder")).await? else {
                        return Res::Ok(None);
                    };
                    let Some(next) = granted(waiter.clone()).await? else {
                        return fail(format!("{waiter} has no grantTime"));
                    };
                    let gap = next.duration_since(first).as_secs_f64() * 1000.0;
                    return Res::Ok(Some(gap - ms(DURATION)));
                }
                if held.elapsed() > Duration::from_secs(30) {
                    return fail(format!("{waiter} not granted 30 s after it was queued"));
                }
                // Beats every third of the term, as the library does.
                if last_beat.elapsed() >= DURATION / 3 {
                    let _ = beat(&claims, &waiter).await;
                    last_beat = Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    futures::future::join_all(tasks).await.into_iter().collect()
}

fn print_writes(writes: &BTreeMap<String, f64>, beats: f64) {
    for (what, count) in writes {
        println!(
            "  {count:>8.0} {what:<40} {:.2} each",
            count / beats.max(1.0)
        );
    }
}

fn top_writes(writes: &BTreeMap<String, f64>, beats: f64) -> String {
    let mut all: Vec<(&String, &f64)> = writes.iter().collect();
    all.sort_by(|a, b| b.1.total_cmp(a.1));
    all.iter()
        .take(4)
        .map(|(w, c)| format!("{w} {:.2}", *c / beats.max(1.0)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Leases and claims created one by one while the operator runs (`--live`).
async fn live(
    client: &Client,
    args: &Args,
    results: &Results,
    n: usize,
    run: usize,
    ns: &str,
    names: &[String],
) -> Res<()> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), ns);
    let grants = Grants::watch(client, None);
    grants.synced().await;
    let log = args.log_dir.join(format!("live-{n}-run{run}-{ns}.log"));
    let mut operator = Operator::start(&args.operator, Some(ns), ns, &log, &args.rust_log)?;
    println!(
        "operator pid {} (namespace {ns} only), log {}",
        operator.pid,
        log.display()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = rss_mib(operator.pid);
    let started = Instant::now();
    let pp = PostParams::default();
    let mut next_print = Instant::now();
    for (i, l) in names.iter().enumerate() {
        leases.create(&pp, &lease(l, 3600)).await?;
        claims.create(&pp, &claim(&format!("c-{l}"), l)).await?;
        if Instant::now() >= next_print {
            next_print = Instant::now() + Duration::from_secs(5);
            println!(
                "t+{:>5.1}s created {i:>6}/{n} granted {:>6}  {}",
                started.elapsed().as_secs_f64(),
                grants.granted_in(ns).0,
                operator.proc_line()
            );
        }
    }
    let created = started.elapsed();
    let mut last_count = 0;
    let mut last_change = Instant::now();
    loop {
        let (count, _, _) = grants.granted_in(ns);
        if count >= n {
            break;
        }
        if count != last_count {
            (last_count, last_change) = (count, Instant::now());
        }
        if last_change.elapsed() > Duration::from_secs(args.stall) || !operator.alive() {
            let report = failure_report(client, &operator, &[ns], &grants).await;
            operator.stop();
            println!("{report}");
            return fail(format!(
                "stalled: {count} of {n} granted, none for {} s (log: {})",
                args.stall,
                log.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let all = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = rss_mib(operator.pid);
    println!(
        "created {n} leases + claims one by one in {:.1} s; all granted {:.1} s after the first create; RSS {rss:.1} MiB (idle {idle:.1})",
        created.as_secs_f64(),
        all.as_secs_f64()
    );
    results.value(
        "scale",
        "fenced-lease",
        &format!("N={n}: RSS, leases and claims created one by one"),
        rss,
        "MiB",
        &format!(
            "idle {idle:.1} MiB; all granted {:.1} s after the first create",
            all.as_secs_f64()
        ),
    );
    println!("{}", operator.log_summary());
    operator.stop();
    Ok(())
}
