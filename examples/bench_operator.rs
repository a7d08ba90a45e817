//! Measures the operator against a running control plane and prints figures:
//! grant latency (claim created -> Granted seen by a watch), hand-over latency (holder's claim
//! deleted -> next claim Granted seen), and the operator's resident memory with many leases.
//!
//! ```console
//! $ eval "$(hack/control-plane up)"
//! $ cargo build --release --bin fenced-lease-operator
//! $ cargo run --release --example bench_operator -- --operator target/release/fenced-lease-operator
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use fenced_lease::api::{ClaimPhase, FencedLease, FencedLeaseClaim};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

/// Benchmark fenced-lease-operator against the control plane KUBECONFIG points at.
#[derive(Parser)]
struct Args {
    /// The operator binary to measure.
    #[arg(long, default_value = "target/release/fenced-lease-operator")]
    operator: PathBuf,
    /// Samples of each latency.
    #[arg(long, default_value_t = 60)]
    samples: usize,
    /// Leases (each with one holding claim) for the memory figure.
    #[arg(long, default_value_t = 1000)]
    leases: usize,
}

type Seen = Arc<Mutex<HashMap<String, Instant>>>;

fn lease(name: &str) -> FencedLease {
    serde_json::from_value(json!({"apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease", "metadata": {"name": name}, "spec": {"leaseDurationSeconds": 300}})).unwrap()
}

fn claim(name: &str, lease: &str) -> FencedLeaseClaim {
    serde_json::from_value(json!({"apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim", "metadata": {"name": name}, "spec": {"leaseName": lease, "holderIdentity": name}})).unwrap()
}

/// Records when each claim is first seen Granted, by a watch.
fn watch_grants(claims: Api<FencedLeaseClaim>) -> Seen {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        let mut stream = watcher(claims, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) = event {
                if c.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Granted) {
                    record
                        .lock()
                        .unwrap()
                        .entry(c.name_any())
                        .or_insert_with(Instant::now);
                }
            }
        }
    });
    seen
}

async fn granted_at(seen: &Seen, name: &str) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(at) = seen.lock().unwrap().get(name) {
            return *at;
        }
        assert!(
            Instant::now() < deadline,
            "{name} was not granted within 60s"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    println!(
        "{what:<28} n={:<4} median {:>7.1} ms   p90 {:>7.1} ms   worst {:>7.1} ms   best {:>6.1} ms",
        samples.len(),
        ms(pct(0.5)),
        ms(pct(0.9)),
        ms(*samples.last().unwrap()),
        ms(samples[0])
    );
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let client = Client::try_default()
        .await
        .expect("KUBECONFIG pointing at a control plane");
    let ns = format!("bench-{:06x}", rand::random::<u32>() & 0xffffff);
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let operator = Operator(
        Command::new(&args.operator)
            .args([
                "--namespace",
                &ns,
                "--operator-namespace",
                &ns,
                "--leader-election=false",
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the operator"),
    );
    let pid = operator.0.id();
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), &ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), &ns);
    let seen = watch_grants(claims.clone());
    let pp = PostParams::default();
    println!(
        "operator {} (pid {pid}), namespace {ns}, {} cores",
        args.operator.display(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    tokio::time::sleep(Duration::from_secs(1)).await; // caches sync

    // Grant latency: a free lease, one claim.
    leases.create(&pp, &lease("grant")).await.unwrap();
    let mut grant = vec![];
    for i in 0..args.samples {
        let name = format!("g-{i}");
        let start = Instant::now();
        claims.create(&pp, &claim(&name, "grant")).await.unwrap();
        grant.push(granted_at(&seen, &name).await - start);
        claims
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
    }
    report("grant (create -> Granted)", grant);

    // Hand-over latency: the holder releases, the waiter is granted.
    leases.create(&pp, &lease("handover")).await.unwrap();
    claims.create(&pp, &claim("h-0", "handover")).await.unwrap();
    granted_at(&seen, "h-0").await;
    let mut handover = vec![];
    for i in 1..=args.samples {
        let (holder, waiter) = (format!("h-{}", i - 1), format!("h-{i}"));
        claims
            .create(&pp, &claim(&waiter, "handover"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await; // queued behind the holder
        let start = Instant::now();
        claims
            .delete(&holder, &DeleteParams::default())
            .await
            .unwrap();
        handover.push(granted_at(&seen, &waiter).await - start);
    }
    report("hand-over (delete -> Granted)", handover);

    // Expiry: a holder that never beats is expired a lease duration (1 s) after its grant;
    // how late after that does the next claim get the lease?
    let expiring: FencedLease = serde_json::from_value(
        json!({"apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease", "metadata": {"name": "expiry"}, "spec": {"leaseDurationSeconds": 1}}),
    )
    .unwrap();
    leases.create(&pp, &expiring).await.unwrap();
    claims.create(&pp, &claim("e-0", "expiry")).await.unwrap();
    let mut granted = granted_at(&seen, "e-0").await;
    let mut lateness = vec![];
    for i in 1..=args.samples.min(20) {
        let waiter = format!("e-{i}");
        claims.create(&pp, &claim(&waiter, "expiry")).await.unwrap();
        let next = granted_at(&seen, &waiter).await;
        lateness.push((next - granted).saturating_sub(Duration::from_secs(1)));
        granted = next;
    }
    report("expiry (after lease duration)", lateness);

    // Memory with many leases, each held by one claim.
    let before = rss_kib(pid);
    let start = Instant::now();
    for i in 0..args.leases {
        leases.create(&pp, &lease(&format!("m-{i}"))).await.unwrap();
        claims
            .create(&pp, &claim(&format!("mc-{i}"), &format!("m-{i}")))
            .await
            .unwrap();
    }
    for i in 0..args.leases {
        granted_at(&seen, &format!("mc-{i}")).await;
    }
    let elapsed = start.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "{} leases + {} claims: all granted {:.1} s after the first create; operator RSS {:.1} MiB (was {:.1} MiB with 2 leases)",
        args.leases,
        args.leases,
        elapsed.as_secs_f64(),
        rss_kib(pid) as f64 / 1024.0,
        before as f64 / 1024.0
    );
    drop(operator);
    // Clean up: with the operator gone, nothing else removes the leases' finalizers.
    let strip = kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}}));
    for l in leases
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let _ = leases
            .patch(&l.name_any(), &Default::default(), &strip)
            .await;
    }
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
}
