//! Rates: the apiserver's own write rate on this machine (the ceiling of everything else),
//! grants per second at a steady create rate, hand-overs per second on one lease, and how
//! many apiserver writes a grant and a heartbeat cost (the apiserver's
//! `apiserver_request_total`, read with the admin kubeconfig).
//!
//! ```console
//! $ eval "$(hack/control-plane up)"
//! $ cargo build --release --bin fenced-lease-operator
//! $ cargo run --release --bin bench-throughput -- --operator target/release/fenced-lease-operator
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
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// The operator binary to measure.
    #[arg(long, default_value = "target/release/fenced-lease-operator")]
    operator: PathBuf,
    /// Requests in flight for the apiserver's raw write rate (one figure each).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    raw_concurrency: Vec<usize>,
    /// Seconds of each raw write-rate measurement.
    #[arg(long, default_value_t = 5)]
    raw_seconds: u64,
    /// Claims created per second (one figure each), each on its own free lease.
    #[arg(long, value_delimiter = ',', default_value = "20,100")]
    rates: Vec<f64>,
    /// Seconds of each steady-rate measurement.
    #[arg(long, default_value_t = 5)]
    rate_seconds: u64,
    /// Hand-overs measured on one lease.
    #[arg(long, default_value_t = 100)]
    handovers: usize,
    /// Also measure the first `--handovers` hand-overs of a queue this long (0: not).
    #[arg(long, default_value_t = 0)]
    deep_queue: usize,
    /// Heartbeats on one held claim, for the writes each costs.
    #[arg(long, default_value_t = 20)]
    beats: usize,
    /// Directory for the operator's log.
    #[arg(long, default_value = "/tmp/fenced-lease-bench")]
    log_dir: PathBuf,
    /// Append result rows here (tab-separated; hack/bench renders them).
    #[arg(long)]
    results: Option<PathBuf>,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(e) = bench(args).await {
        eprintln!("bench_throughput: {e}");
        std::process::exit(1);
    }
}

async fn bench(args: Args) -> Res<()> {
    let client = client().await?;
    let results = Results::new(args.results.clone());
    let _ = std::fs::create_dir_all(&args.log_dir);

    // The apiserver alone: status patches of FencedLeases no operator watches.
    let raw_ns = namespace(&client, "raw").await?;
    raw_writes(&client, &args, &results, &raw_ns).await?;
    cleanup(&client, &raw_ns).await;

    let ns = namespace(&client, "rates").await?;
    let log = args.log_dir.join(format!("throughput-{ns}.log"));
    let mut operator = Operator::start(&args.operator, Some(&ns), &ns, &log, "info")?;
    println!(
        "namespace {ns}; operator pid {} (log {})",
        operator.pid,
        log.display()
    );
    let grants = Grants::watch(&client, Some(&ns));
    grants.synced().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let outcome = async {
        steady_rates(&client, &args, &results, &ns, &grants).await?;
        handovers(&client, &args, &results, &ns, &grants).await?;
        heartbeat_writes(&client, &args, &results, &ns, &grants).await
    }
    .await;
    if let Err(e) = &outcome {
        println!("FAILED: {e}");
        println!(
            "{}",
            failure_report(&client, &operator, &[&ns], &grants).await
        );
    }
    operator.stop();
    println!("{}", operator.log_summary());
    cleanup(&client, &ns).await;
    outcome
}

async fn raw_writes(client: &Client, args: &Args, results: &Results, ns: &str) -> Res<()> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = (0..64).map(|i| format!("raw-{i}")).collect();
    create_all(&leases, names.iter().map(|n| lease(n, 60)).collect(), 16).await?;
    for &c in &args.raw_concurrency {
        let deadline = Instant::now() + Duration::from_secs(args.raw_seconds);
        let counter = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let workers = (0..c).map(|w| {
            let (leases, name, counter) = (
                leases.clone(),
                names[w % names.len()].clone(),
                counter.clone(),
            );
            async move {
                let mut latencies = vec![];
                while Instant::now() < deadline {
                    let k = counter.fetch_add(1, Ordering::Relaxed);
                    let patch = json!({"status": {"waiting": (k % 1000) as i32}});
                    let at = Instant::now();
                    leases
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                    latencies.push(ms(at.elapsed()));
                }
                Res::Ok(latencies)
            }
        });
        let all: Vec<f64> = futures::future::try_join_all(workers)
            .await?
            .into_iter()
            .flatten()
            .collect();
        let rate = all.len() as f64 / started.elapsed().as_secs_f64();
        results.value(
            "apiserver",
            "kube-apiserver + etcd (this machine)",
            &format!("status writes/s, {c} in flight"),
            rate,
            "/s",
            "merge patches of FencedLease status, no operator",
        );
        results.samples(
            "apiserver",
            "kube-apiserver + etcd (this machine)",
            &format!("status write latency, {c} in flight"),
            &all,
            "ms",
            "",
        );
    }
    Ok(())
}

async fn steady_rates(
    client: &Client,
    args: &Args,
    results: &Results,
    ns: &str,
    grants: &Grants,
) -> Res<()> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), ns);
    for (r, &rate) in args.rates.iter().enumerate() {
        let count = (rate * args.rate_seconds as f64).round() as usize;
        let names: Vec<String> = (0..count).map(|i| format!("s{r}-{i}")).collect();
        create_all(&leases, names.iter().map(|n| lease(n, 3600)).collect(), 16).await?;
        // Wait for the finalizers, so the grants are all that is left to do.
        let deadline = Instant::now() + Duration::from_secs(60);
        while with_finalizer(client, ns).await < names.len() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = apiserver_writes(client).await?;
        let started = Instant::now();
        let created: Vec<(String, Instant)> = futures::stream::iter(names.iter().enumerate())
            .map(|(i, n)| {
                let claims = claims.clone();
                let at = started + Duration::from_secs_f64(i as f64 / rate);
                async move {
                    tokio::time::sleep_until(at.into()).await;
                    let name = format!("c-{n}");
                    claims
                        .create(&PostParams::default(), &claim(&name, n))
                        .await?;
                    Res::Ok((name, Instant::now()))
                }
            })
            .buffer_unordered(64)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Res<_>>()?;
        let mut latencies = vec![];
        let mut last = started;
        for (name, at) in &created {
            let granted = grants.wait(ns, name, Duration::from_secs(60)).await?;
            latencies.push(ms(granted.saturating_duration_since(*at)));
            last = last.max(granted);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut writes = diff(&before, &apiserver_writes(client).await?);
        // The claims are the bench's writes, not the operator's.
        writes.remove("POST fencedleaseclaims");
        let per_grant = total(&writes) / count as f64;
        let achieved = count as f64 / (last - started).as_secs_f64();
        results.samples(
            "rates",
            "fenced-lease",
            &format!("grant latency at {rate:.0} claims/s"),
            &latencies,
            "ms",
            &format!("claim created -> Granted seen; {achieved:.0} grants/s achieved"),
        );
        results.value(
            "rates",
            "fenced-lease",
            &format!("operator writes per grant at {rate:.0} claims/s"),
            per_grant,
            "",
            &breakdown(&writes, count as f64),
        );
    }
    Ok(())
}

/// Hand-overs per second on one lease: holders release the moment they are granted.
async fn handovers(
    client: &Client,
    args: &Args,
    results: &Results,
    ns: &str,
    grants: &Grants,
) -> Res<()> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    let n = args.handovers;

    // (a) A queue of n waiters, each releasing as soon as it holds; then (with --deep-queue)
    // the first n hand-overs of a queue that long.
    queue_handovers(&claims, &leases, results, ns, grants, "queue", n, n).await?;
    if args.deep_queue > 0 {
        let deep = args.deep_queue.max(n);
        queue_handovers(&claims, &leases, results, ns, grants, "deep", deep, n).await?;
    }

    // (b) One waiter at a time: the next claim is created, then the holder releases.
    leases.create(&pp, &lease("pair", 3600)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    claims.create(&pp, &claim("p-00000", "pair")).await?;
    let first = grants.wait(ns, "p-00000", Duration::from_secs(60)).await?;
    let mut last = first;
    let mut gaps = vec![];
    for i in 1..=n {
        let (holder, waiter) = (format!("p-{:05}", i - 1), format!("p-{i:05}"));
        claims.create(&pp, &claim(&waiter, "pair")).await?;
        claims.delete(&holder, &DeleteParams::default()).await?;
        let at = grants.wait(ns, &waiter, Duration::from_secs(60)).await?;
        gaps.push(ms(at - last));
        last = at;
    }
    let rate = n as f64 / (last - first).as_secs_f64();
    results.value(
        "rates",
        "fenced-lease",
        "hand-overs/s, one lease, 1 waiter",
        rate,
        "/s",
        "create the next claim, delete the holder's, wait for the grant",
    );
    results.samples(
        "rates",
        "fenced-lease",
        "hand-over gap, one lease, 1 waiter",
        &gaps,
        "ms",
        "grant seen -> next grant seen",
    );
    Ok(())
}

/// `measured` hand-overs at the head of a queue of `queued` claims on lease `lease`: each
/// holder deletes its claim once the bench sees its grant.
#[allow(clippy::too_many_arguments)]
async fn queue_handovers(
    claims: &Api<FencedLeaseClaim>,
    leases: &Api<FencedLease>,
    results: &Results,
    ns: &str,
    grants: &Grants,
    lease_name: &str,
    queued: usize,
    measured: usize,
) -> Res<()> {
    let pp = PostParams::default();
    leases.create(&pp, &lease(lease_name, 3600)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let names: Vec<String> = (0..=queued)
        .map(|i| format!("{lease_name}-{i:05}"))
        .collect();
    // The claims measured one at a time, so they queue in this order; those behind them many
    // at a time.
    for name in &names[..=measured] {
        claims.create(&pp, &claim(name, lease_name)).await?;
    }
    let behind: Vec<FencedLeaseClaim> = names[measured + 1..]
        .iter()
        .map(|n| claim(n, lease_name))
        .collect();
    if !behind.is_empty() {
        create_all(claims, behind, 32).await?;
        println!("{queued} claims queued on lease {lease_name}");
    }
    // Hand-overs are measured on a settled queue: every claim has had its first answer (its
    // place in the queue), so the operator is not still answering new claims meanwhile.
    let prefix = format!("{lease_name}-");
    let settled = grants
        .wait_answered(ns, &prefix, queued + 1, Duration::from_secs(1200))
        .await?;
    println!(
        "{} claims on lease {lease_name} answered {:.1} s after the last create",
        queued + 1,
        settled.as_secs_f64()
    );
    // The clock starts when the first holder lets go (it was granted before the wait).
    grants.wait(ns, &names[0], Duration::from_secs(60)).await?;
    let mut times = vec![Instant::now()];
    claims.delete(&names[0], &DeleteParams::default()).await?;
    for name in &names[1..=measured] {
        let at = grants.wait(ns, name, Duration::from_secs(60)).await?;
        times.push(at);
        claims.delete(name, &DeleteParams::default()).await?;
    }
    let rate = measured as f64 / (times[measured] - times[0]).as_secs_f64();
    let gaps: Vec<f64> = times.windows(2).map(|w| ms(w[1] - w[0])).collect();
    let what = if measured == queued {
        format!("{queued} queued")
    } else {
        format!("{queued} queued, first {measured}")
    };
    results.value(
        "rates",
        "fenced-lease",
        &format!("hand-overs/s, one lease, {what}"),
        rate,
        "/s",
        "each holder deletes its claim once it sees the grant",
    );
    results.samples(
        "rates",
        "fenced-lease",
        &format!("hand-over gap, one lease, {what}"),
        &gaps,
        "ms",
        "grant seen (the first: holder deletes) -> next grant seen",
    );
    Ok(())
}

/// Apiserver writes per heartbeat on one held claim.
async fn heartbeat_writes(
    client: &Client,
    args: &Args,
    results: &Results,
    ns: &str,
    grants: &Grants,
) -> Res<()> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    leases.create(&pp, &lease("beats", 3600)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    claims.create(&pp, &claim("beater", "beats")).await?;
    grants.wait(ns, "beater", Duration::from_secs(30)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = apiserver_writes(client).await?;
    for _ in 0..args.beats {
        beat(&claims, "beater").await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = diff(&before, &apiserver_writes(client).await?);
    let beats = args.beats as f64;
    for (what, count) in &writes {
        println!("  {count:>6.0} {what}");
    }
    // Only what a heartbeat can cause: the apiserver also counts, say, the namespace
    // controller emptying another benchmark's namespace, or leader-election renewals.
    let (caused, other): (BTreeMap<String, f64>, BTreeMap<String, f64>) =
        writes.into_iter().partition(|(what, _)| {
            let resource = what.split(' ').nth(1).unwrap_or("");
            let resource = resource.split('/').next().unwrap_or("");
            ["fencedleases", "fencedleaseclaims", "pods", "events"].contains(&resource)
        });
    results.value(
        "rates",
        "fenced-lease",
        "apiserver writes per heartbeat (1 holder)",
        total(&caused) / beats,
        "",
        &format!(
            "{}; not counted, other writes meanwhile: {:.2}/heartbeat",
            breakdown(&caused, beats),
            total(&other) / beats
        ),
    );
    Ok(())
}

fn breakdown(writes: &std::collections::BTreeMap<String, f64>, per: f64) -> String {
    let mut all: Vec<_> = writes.iter().collect();
    all.sort_by(|a, b| b.1.total_cmp(a.1));
    all.iter()
        .take(5)
        .map(|(w, c)| format!("{w} {:.2}", *c / per))
        .collect::<Vec<_>>()
        .join(", ")
}
