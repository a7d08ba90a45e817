//! How long a pod waits, after a grant, for its token in a file: the kubelet's downward-API
//! volume (the annotation `token.fencing.dev/<lease>` the operator writes on the holder's pod)
//! against `kubectl fence token -w --file` in a sidecar (the lease's status, watched), side by
//! side in one pod on a real node (hack/node; `make test-node` runs it).
//!
//! The pod's probe container (this program with `--probe`) takes the lease `--grants` times
//! with the holder library; after each grant it reads both files every 2 ms until each holds
//! the new token, and reports both delays. Prints median, p99 and worst of each; the probe's
//! reports are kept in `--log-dir`.
//!
//! ```console
//! $ cargo build --all-features --bin bench-token-delivery
//! $ bench-token-delivery --image localhost/fenced-lease-demo:dev \
//!     --sidecar-image ghcr.io/fenced-lease/fenced-lease-operator:0.2.0 \
//!     --holder-cluster-role fl-fenced-lease-holder --grants 50
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use fenced_lease::api::{FencedLease, TOKEN_ANNOTATION_PREFIX};
use fenced_lease::holder::{AcquireOptions, acquire};
use fenced_lease_bench::cluster::create_namespace;
use futures::{AsyncBufReadExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Client;
use kube::api::{Api, DeleteParams, LogParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::json;

type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

const LEASE: &str = "delivery";
const DOWNWARD: &str = "/fence/downward/token";
const SIDECAR: &str = "/fence/sidecar/token";
/// How long a file may lag a grant before the run fails: the kubelet's default sync period
/// (1 min) plus its cache's, twice over.
const GIVE_UP: Duration = Duration::from_secs(240);

#[derive(Parser)]
struct Args {
    /// The image holding this program (at /bench-token-delivery).
    #[arg(long)]
    image: Option<String>,
    /// The image holding kubectl-fence (at /kubectl-fence): the operator's.
    #[arg(long)]
    sidecar_image: Option<String>,
    /// The ClusterRole of a holder (the chart's `<fullname>-holder`), bound to the probe's
    /// ServiceAccount.
    #[arg(long)]
    holder_cluster_role: Option<String>,
    /// Grants to measure.
    #[arg(long, default_value_t = 50)]
    grants: usize,
    /// Where the probe's reports go.
    #[arg(long, default_value = "bench/runs")]
    log_dir: PathBuf,
    /// Run as the probe (inside the pod).
    #[arg(long, hide = true)]
    probe: bool,
    /// The probe's namespace.
    #[arg(long, hide = true)]
    namespace: Option<String>,
}

/// One grant, as the probe reports it.
#[derive(Serialize, Deserialize)]
struct Delivery {
    token: i64,
    downward_ms: f64,
    sidecar_ms: f64,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let outcome = if args.probe {
        probe(&args).await
    } else {
        measure(&args).await
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-token-delivery: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

// ---- the probe, in the pod ----------------------------------------------------------------

async fn probe(args: &Args) -> Result<()> {
    let client = Client::try_default().await?;
    let namespace = args.namespace.as_deref().ok_or("--namespace is required")?;
    for _ in 0..args.grants {
        let options = AcquireOptions::default().wait(Duration::from_secs(60));
        let guard = acquire(client.clone(), namespace, LEASE, options).await?;
        let (granted, token) = (Instant::now(), guard.token()?);
        let want = token.to_string();
        let (mut downward, mut sidecar) = (None, None);
        while downward.is_none() || sidecar.is_none() {
            if granted.elapsed() > GIVE_UP {
                let seen =
                    |at: Option<f64>| at.map_or("not yet".into(), |ms| format!("after {ms:.0} ms"));
                return Err(format!(
                    "token {token} after {GIVE_UP:?}: in {DOWNWARD} {}, in {SIDECAR} {}",
                    seen(downward),
                    seen(sidecar)
                )
                .into());
            }
            for (file, seen) in [(DOWNWARD, &mut downward), (SIDECAR, &mut sidecar)] {
                if seen.is_none() && holds(Path::new(file), &want) {
                    *seen = Some(granted.elapsed().as_secs_f64() * 1e3);
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let delivery = Delivery {
            token,
            downward_ms: downward.unwrap_or_default(),
            sidecar_ms: sidecar.unwrap_or_default(),
        };
        println!("{}", serde_json::to_string(&delivery)?);
        guard.release().await?;
    }
    Ok(())
}

fn holds(file: &Path, token: &str) -> bool {
    std::fs::read_to_string(file).is_ok_and(|t| t.trim() == token)
}

// ---- the measurement, outside -------------------------------------------------------------

async fn measure(args: &Args) -> Result<()> {
    let (image, sidecar_image, role) = (
        args.image.as_deref().ok_or("--image is required")?,
        args.sidecar_image
            .as_deref()
            .ok_or("--sidecar-image is required")?,
        args.holder_cluster_role
            .as_deref()
            .ok_or("--holder-cluster-role is required")?,
    );
    let client = Client::try_default().await?;
    let namespace = format!("bench-token-{:08x}", rand::random::<u32>());
    create_namespace(&client, &namespace).await?;
    let outcome = run(&client, &namespace, image, sidecar_image, role, args).await;
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), &namespace);
    let _ = leases.delete(LEASE, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&namespace, &DeleteParams::default())
        .await;
    outcome
}

async fn run(
    client: &Client,
    namespace: &str,
    image: &str,
    sidecar_image: &str,
    role: &str,
    args: &Args,
) -> Result<()> {
    let create = PostParams::default();
    let lease: FencedLease = serde_json::from_value(json!({
        "metadata": {"name": LEASE}, "spec": {"leaseDurationSeconds": 15},
    }))?;
    Api::<FencedLease>::namespaced(client.clone(), namespace)
        .create(&create, &lease)
        .await?;
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "probe"}}))?;
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(&create, &account)
        .await?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "probe", "namespace": namespace}],
    }))?;
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .create(&create, &binding)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.create(
        &create,
        &probe_pod(namespace, image, sidecar_image, args.grants)?,
    )
    .await?;
    let started = Instant::now();
    let deliveries = follow(&pods, args.grants).await?;
    let wall = started.elapsed();
    std::fs::create_dir_all(&args.log_dir)?;
    let log = args.log_dir.join(format!(
        "token-delivery-{}.jsonl",
        k8s_openapi::jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ")
    ));
    let lines: Vec<String> = deliveries
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<_, _>>()?;
    std::fs::write(&log, lines.join("\n") + "\n")?;
    println!(
        "Token delivery after a grant, {} grants in {:.0} s (one pod on hack/node; reports in {}):",
        deliveries.len(),
        wall.as_secs_f64(),
        log.display()
    );
    println!("  {:<44} {:>9} {:>9} {:>9}", "", "median", "p99", "worst");
    for (what, pick) in [
        (
            "downward-API volume (the kubelet)",
            (|d: &Delivery| d.downward_ms) as fn(&Delivery) -> f64,
        ),
        ("kubectl fence token -w --file (sidecar)", |d| d.sidecar_ms),
    ] {
        let (median, p99, worst) = figures(deliveries.iter().map(pick).collect());
        println!("  {what:<44} {median:>7.0}ms {p99:>7.0}ms {worst:>7.0}ms");
    }
    Ok(())
}

/// The probe's pod: the probe, the sidecar, the downward-API volume and the shared one.
fn probe_pod(namespace: &str, image: &str, sidecar_image: &str, grants: usize) -> Result<Pod> {
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    let env = json!([
        {"name": "POD_NAME", "valueFrom": field("metadata.name")},
        {"name": "POD_UID", "valueFrom": field("metadata.uid")},
        {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
        {"name": "RUST_LOG", "value": "warn"},
    ]);
    let locked = json!({
        "runAsNonRoot": true, "readOnlyRootFilesystem": true,
        "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
    });
    let mounts = json!([
        {"name": "downward", "mountPath": "/fence/downward", "readOnly": true},
        {"name": "sidecar", "mountPath": "/fence/sidecar"},
    ]);
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": {
            "serviceAccountName": "probe",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "probe", "image": image, "imagePullPolicy": "Never",
                    "command": ["/bench-token-delivery", "--probe", "--namespace", namespace,
                                "--grants", grants.to_string()],
                    "env": env, "securityContext": locked, "volumeMounts": mounts,
                },
                {
                    "name": "token", "image": sidecar_image, "imagePullPolicy": "Never",
                    "command": ["/kubectl-fence", "token", LEASE, "-w", "--file", SIDECAR],
                    "env": env, "securityContext": locked,
                    "volumeMounts": [{"name": "sidecar", "mountPath": "/fence/sidecar"}],
                },
            ],
            "volumes": [
                {"name": "downward", "downwardAPI": {"items": [{
                    "path": "token",
                    "fieldRef": {"fieldPath": format!("metadata.annotations['{TOKEN_ANNOTATION_PREFIX}/{LEASE}']")},
                }]}},
                {"name": "sidecar", "emptyDir": {"medium": "Memory"}},
            ],
        },
    }))?)
}

/// The probe's reports, from its log, until it has made `grants` or ended.
async fn follow(pods: &Api<Pod>, grants: usize) -> Result<Vec<Delivery>> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while pods
        .get("probe")
        .await?
        .status
        .and_then(|s| s.phase)
        .is_none_or(|p| p == "Pending")
    {
        if Instant::now() > deadline {
            return Err("the probe's pod did not start within 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let params = LogParams {
        container: Some("probe".into()),
        follow: true,
        ..LogParams::default()
    };
    let mut lines = Box::pin(pods.log_stream("probe", &params).await?.lines());
    let mut deliveries = Vec::new();
    while deliveries.len() < grants {
        let Some(line) = lines.try_next().await? else {
            break;
        };
        match serde_json::from_str::<Delivery>(&line) {
            Ok(delivery) => deliveries.push(delivery),
            Err(_) => eprintln!("probe: {line}"),
        }
    }
    if deliveries.len() < grants {
        let name = pods.resource_url();
        return Err(format!(
            "the probe ended after {} of {grants} grants ({name}/probe)",
            deliveries.len()
        )
        .into());
    }
    Ok(deliveries)
}

/// Median, p99 and worst.
fn figures(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let index = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len()) - 1;
        values[index]
    };
    (
        at(0.5),
        at(0.99),
        values.last().copied().unwrap_or_default(),
    )
}
