//! The window of a FencedLease that follows a coordination Lease (`spec.follow`, issue 41):
//! from the apiserver's acceptance of the Lease write that changes its holder (the answer to
//! that write, as client-go's elector gets it) to the first refused write of the old holder's
//! pod. The operator (the real binary) is in that path: it sees the Lease change, reads it
//! again, writes the lease status, and the apiserver's informer brings the status to the
//! admission policies.
//!
//! Beside it, in the same run and interleaved sample by sample, the same window with the
//! operator out of the path: the status naming the new holder written directly (as the admin,
//! in a namespace the operator does not serve), so that the difference is the operator's part.
//! Both leases fence labelled ConfigMaps (`spec.fenceObjects`: the one policy binding every
//! namespace shares), and the probes are dry-run creates of such a ConfigMap stamped with the
//! largest token (so that only the identity rule refuses them), as the old holder's pod
//! (Pending pods, tokens bound to them, as a pod mounts). Also reported: from the same Lease
//! write to the first accepted write of the new holder's pod.
//!
//! ```console
//! $ eval "$(hack/control-plane up)"
//! $ kubectl apply -f crds/ -f deploy/admission/
//! $ cargo run --release --bin bench-follow -- --operator target/release/fenced-lease-operator
//! ```
//!
//! `make bench` runs it (section `follow`); every sample goes to `--log-dir`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use fenced_lease::api::{FencedLease, LEASE_LABEL, MAX_TOKEN, TOKEN_ANNOTATION};
use fenced_lease_bench::cluster::{cleanup, namespace};
use fenced_lease_bench::figures::{Results, ms};
use fenced_lease_bench::operator::Operator;
use fenced_lease_bench::writers::{WriterPod, until, writer_clients, writer_pods};
use fenced_lease_bench::{Res, fail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// The operator binary to measure.
    #[arg(long, default_value = "target/release/fenced-lease-operator")]
    operator: PathBuf,
    /// Changes of holder measured, of each kind (followed, direct).
    #[arg(long, default_value_t = 500)]
    changes: usize,
    /// Seconds any one API call, or one window, may take before it counts as failed.
    #[arg(long, default_value_t = 30)]
    call_timeout: u64,
    /// Directory for the operator's log and every sample.
    #[arg(long, default_value = "/tmp/fenced-lease-bench")]
    log_dir: PathBuf,
    /// Append result rows here (tab-separated; hack/bench renders them).
    #[arg(long)]
    results: Option<PathBuf>,
}

const SECTION: &str = "follow";
/// The FencedLease of each namespace; the followed Lease.
const FENCED: &str = "fenced";
const FOLLOWED: &str = "ctrl";

#[tokio::main]
async fn main() -> Res<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.log_dir)?;
    let client = Client::try_default().await?;
    let followed_ns = namespace(&client, "bench-follow").await?;
    let direct_ns = namespace(&client, "bench-follow-direct").await?;
    let log = args.log_dir.join("follow-operator.log");
    let mut operator = Operator::start(
        &args.operator,
        Some(&followed_ns),
        &followed_ns,
        &log,
        "info",
    )?;
    let outcome = run(&client, &args, &followed_ns, &direct_ns).await;
    let alive = operator.alive();
    operator.stop();
    for ns in [&followed_ns, &direct_ns] {
        cleanup(&client, ns).await;
    }
    if !alive {
        return fail(format!("the operator exited; its log: {}", log.display()));
    }
    outcome
}

/// One kind of hand-over: the namespace, its writer pods, and how a holder is named.
struct Side {
    ns: String,
    writers: Vec<WriterPod>,
    pods: Vec<(String, String)>,
}

async fn side(client: &Client, ns: &str, timeout: Duration) -> Res<Side> {
    let pods = writer_pods(client, ns, timeout).await?;
    let probe = ConfigMap {
        metadata: ObjectMeta {
            generate_name: Some("probe-".into()),
            labels: Some(BTreeMap::from([(LEASE_LABEL.into(), FENCED.into())])),
            // The largest token: the token rule never refuses it, so only the identity rule can.
            annotations: Some(BTreeMap::from([(
                TOKEN_ANNOTATION.into(),
                MAX_TOKEN.to_string(),
            )])),
            ..Default::default()
        },
        ..Default::default()
    };
    let writers = writer_clients(client, ns, &pods, probe, timeout).await?;
    Ok(Side {
        ns: ns.into(),
        writers,
        pods,
    })
}

async fn run(client: &Client, args: &Args, followed_ns: &str, direct_ns: &str) -> Res<()> {
    let timeout = Duration::from_secs(args.call_timeout);
    let followed = side(client, followed_ns, timeout).await?;
    let direct = side(client, direct_ns, timeout).await?;
    let pp = PostParams::default();
    for (ns, follow) in [(followed_ns, Some(FOLLOWED)), (direct_ns, None)] {
        let lease: FencedLease = serde_json::from_value(json!({
            "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
            "metadata": {"name": FENCED},
            "spec": {"fenceObjects": true, "annotateHolderPod": false,
                     "follow": follow.map(|l| json!({"lease": l}))},
        }))?;
        Api::<FencedLease>::namespaced(client.clone(), ns)
            .create(&pp, &lease)
            .await?;
    }
    let mut file = std::fs::File::create(args.log_dir.join("follow-samples.tsv"))?;
    writeln!(
        file,
        "kind\tsample\tto\trefused_ms\tnew_holder_accepted_ms\tprobes"
    )?;
    let mut windows: BTreeMap<&str, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    // Sample 0 of each side puts the first holder in place and is not counted.
    let mut token = 0;
    for i in 0..=args.changes {
        let (old, new) = if i % 2 == 0 { (1, 0) } else { (0, 1) };
        for (kind, side) in [("followed", &followed), ("direct", &direct)] {
            let started = match kind {
                "followed" => elect(client, side, new, i).await?,
                _ => {
                    token += 1;
                    name_holder(client, side, new, token).await?
                }
            };
            let gave_up = |probes| format!("no change within {timeout:?} ({probes} probes)");
            let refused = || side.writers[old].refused();
            let (refused, probes) = until(started, timeout, refused, gave_up).await?;
            let accepted = || async { Ok(!side.writers[new].refused().await?) };
            let accepted = until(started, timeout, accepted, gave_up).await?.0;
            let to = &side.pods[new].0;
            writeln!(
                file,
                "{kind}\t{i}\t{to}\t{:.3}\t{:.3}\t{probes}",
                ms(refused),
                ms(accepted)
            )?;
            if i > 0 {
                let entry = windows.entry(kind).or_default();
                entry.0.push(ms(refused));
                entry.1.push(ms(accepted));
            }
        }
    }
    let results = Results::new(args.results.clone());
    let n = args.changes;
    for (kind, (refused, accepted)) in &windows {
        let system = match *kind {
            "followed" => "fenced-lease, spec.follow",
            _ => "status written directly (no operator)",
        };
        let from = match *kind {
            "followed" => "Lease write accepted",
            _ => "status write accepted",
        };
        let note = format!("{n} changes of holder, interleaved; samples in follow-samples.tsv");
        let figure = format!("{from} -> old holder's pod refused");
        results.samples(SECTION, system, &figure, refused, "ms", &note);
        let figure = format!("{from} -> new holder's pod accepted");
        results.samples(SECTION, system, &figure, accepted, "ms", &note);
    }
    Ok(())
}

/// Writes the followed Lease as client-go's elector does when `side.pods[to]` takes it (its
/// identity `<pod>_<uuid>`, one more transition); returns when the write was accepted.
async fn elect(client: &Client, side: &Side, to: usize, term: usize) -> Res<Instant> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &side.ns);
    let identity = format!("{}_{:08x}", side.pods[to].0, rand::random::<u32>());
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": FOLLOWED},
        "spec": {"holderIdentity": identity, "leaseDurationSeconds": 15,
                 "leaseTransitions": term},
    });
    let params = PatchParams::apply("bench-follow-elector").force();
    leases
        .patch(FOLLOWED, &params, &Patch::Apply(&lease))
        .await?;
    Ok(Instant::now())
}

/// Writes the lease status naming `side.pods[to]` as holder with `token`, as a grant does;
/// returns when the write was accepted.
async fn name_holder(client: &Client, side: &Side, to: usize, token: i64) -> Res<Instant> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), &side.ns);
    let (pod, uid) = &side.pods[to];
    let status = json!({"status": {
        "fencingToken": token,
        "holder": {"claim": pod, "claimUid": uid, "identity": pod, "podName": pod, "podUid": uid},
    }});
    leases
        .patch_status(FENCED, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(Instant::now())
}
