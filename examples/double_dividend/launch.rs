//! How the demo runs a worker: as a process holding a token bound to a pod no kubelet runs
//! (`make demo`: a control plane without nodes), or as a real pod on a node (`--pods IMAGE`:
//! hack/node). A worker is paused the way a stop-the-world pause looks from outside: SIGSTOP
//! for a process; for a pod, its cgroup frozen (the cgroup v1 freezer, so the demo runs as root
//! on the node's machine).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::{AsyncBufReadExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, LogParams, PostParams};
use kube::{Client, ResourceExt};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::sync::mpsc;

use super::{Report, Result, WORKER_ACCOUNT};

/// What every worker is started with.
pub struct Launch<'a> {
    pub namespace: &'a str,
    pub table: &'a str,
    pub t0_ms: u128,
    /// How long a worker's payment takes.
    pub paying: Duration,
    pub log_dir: &'a Path,
    /// `--pods IMAGE`: run workers as pods of this image; else as processes.
    pub image: Option<&'a str>,
    /// PostgreSQL as the workers reach it.
    pub postgres_url: &'a str,
    pub events: mpsc::UnboundedSender<(&'static str, Report)>,
}

pub enum Worker {
    Process {
        name: &'static str,
        child: tokio::process::Child,
    },
    Pod {
        name: &'static str,
        pods: Api<Pod>,
        uid: String,
    },
}

impl Worker {
    /// Starts worker `name`: its reports go to `launch.events`.
    pub async fn start(client: &Client, launch: &Launch<'_>, name: &'static str) -> Result<Self> {
        match launch.image {
            None => start_process(client, launch, name).await,
            Some(image) => start_pod(client, launch, name, image).await,
        }
    }

    pub fn describe_pause(&self) -> &'static str {
        match self {
            Worker::Process { .. } => "SIGSTOP",
            Worker::Pod { .. } => "freeze (cgroup freezer) the pod of",
        }
    }

    pub fn describe_resume(&self) -> &'static str {
        match self {
            Worker::Process { .. } => "SIGCONT",
            Worker::Pod { .. } => "thaw the pod of",
        }
    }

    pub async fn pause(&self) -> Result<()> {
        match self {
            Worker::Process { child, .. } => signal(child, Signal::SIGSTOP),
            Worker::Pod { uid, .. } => freeze(uid, "FROZEN").await,
        }
    }

    pub async fn resume(&self) -> Result<()> {
        match self {
            Worker::Process { child, .. } => signal(child, Signal::SIGCONT),
            Worker::Pod { uid, .. } => freeze(uid, "THAWED").await,
        }
    }

    /// Waits for the worker to end; an error unless it succeeded.
    pub async fn finish(&mut self) -> Result<()> {
        match self {
            Worker::Process { name, child } => {
                let status = child.wait().await?;
                if !status.success() {
                    return Err(format!("{name} exited with {status}").into());
                }
            }
            Worker::Pod { name, pods, .. } => {
                let ended = super::wait_until(Duration::from_secs(30), || async {
                    phase(pods, name)
                        .await
                        .is_some_and(|p| p != "Running" && p != "Pending")
                })
                .await;
                let last = phase(pods, name).await;
                if ended.is_err() || last.as_deref() != Some("Succeeded") {
                    return Err(format!("pod {name} ended {last:?}").into());
                }
                let _ = pods.delete(name, &DeleteParams::default()).await;
            }
        }
        Ok(())
    }
}

fn signal(child: &tokio::process::Child, signal: Signal) -> Result<()> {
    let pid = child.id().ok_or("worker has exited")?;
    kill(Pid::from_raw(i32::try_from(pid)?), signal)?;
    Ok(())
}

async fn phase(pods: &Api<Pod>, name: &str) -> Option<String> {
    pods.get_opt(name).await.ok()??.status?.phase
}

/// Creates `pod`; its UID.
async fn create(pods: &Api<Pod>, pod: &Pod) -> Result<String> {
    let created = pods.create(&PostParams::default(), pod).await?;
    Ok(created.uid().ok_or("pod without a UID")?)
}

fn worker_args(launch: &Launch<'_>, name: &str) -> Vec<String> {
    [
        "--namespace",
        launch.namespace,
        "--worker",
        name,
        "--table",
        launch.table,
        "--t0-ms",
        &launch.t0_ms.to_string(),
        "--paying-ms",
        &launch.paying.as_millis().to_string(),
    ]
    .map(String::from)
    .to_vec()
}

/// Passes a worker's JSON line on to the demo; other lines (its logs) are left alone.
fn deliver(name: &'static str, line: &str, events: &mpsc::UnboundedSender<(&'static str, Report)>) {
    if let Ok(report) = serde_json::from_str::<Report>(line) {
        let _ = events.send((name, report));
    }
}

// ---- a process --------------------------------------------------------------------------

/// A process acting as pod `name` (Pending: nothing runs in it) with a token bound to it.
async fn start_process(client: &Client, launch: &Launch<'_>, name: &'static str) -> Result<Worker> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), launch.namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "serviceAccountName": WORKER_ACCOUNT,
            "containers": [{"name": "worker", "image": "example.invalid/worker:1"}],
        },
    }))?;
    let uid = create(&pods, &pod).await?;
    let token = pod_token(client, launch.namespace, name, &uid).await?;
    let log = std::fs::File::create(launch.log_dir.join(format!("{name}.log")))?;
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(worker_args(launch, name))
        .env("RUST_LOG", "warn")
        .env("FL_DEMO_TOKEN", token)
        .env("FL_POSTGRES_URL", launch.postgres_url)
        .env("POD_NAME", name)
        .env("POD_UID", &uid)
        .env("POD_NAMESPACE", launch.namespace)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let events = launch.events.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            deliver(name, &line, &events);
        }
    });
    Ok(Worker::Process { name, child })
}

/// The token a kubelet would mount in pod `name` (`uid`): its ServiceAccount's, bound to the
/// pod, so that the apiserver knows which pod writes. Valid for an hour.
async fn pod_token(client: &Client, namespace: &str, name: &str, uid: &str) -> Result<String> {
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {
            "expirationSeconds": 3600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid},
        },
    }))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let issued: TokenRequest = accounts
        .create_subresource("token", WORKER_ACCOUNT, &PostParams::default(), &request)
        .await?;
    Ok(issued
        .status
        .and_then(|s| s.token)
        .ok_or("TokenRequest without a token")?)
}

// ---- a pod ------------------------------------------------------------------------------

/// Pod `name` running the worker in `image`, as the chart runs the operator: non-root, read-only
/// root, no capabilities; its ServiceAccount token is the one the kubelet mounts.
async fn start_pod(
    client: &Client,
    launch: &Launch<'_>,
    name: &'static str,
    image: &str,
) -> Result<Worker> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), launch.namespace);
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    let mut command = vec!["/double-dividend".to_string()];
    command.extend(worker_args(launch, name));
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "double-dividend"}},
        "spec": {
            "serviceAccountName": WORKER_ACCOUNT,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "worker",
                "image": image,
                "imagePullPolicy": "Never",
                "command": command,
                "env": [
                    {"name": "RUST_LOG", "value": "warn"},
                    {"name": "FL_POSTGRES_URL", "value": launch.postgres_url},
                    {"name": "POD_NAME", "valueFrom": field("metadata.name")},
                    {"name": "POD_UID", "valueFrom": field("metadata.uid")},
                    {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
                ],
                "securityContext": {
                    "runAsNonRoot": true,
                    "readOnlyRootFilesystem": true,
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                },
            }],
        },
    }))?;
    let uid = create(&pods, &pod).await?;
    super::wait_until(Duration::from_secs(60), || async {
        phase(&pods, name).await.is_some_and(|p| p != "Pending")
    })
    .await
    .map_err(|e| format!("pod {name} did not start: {e}"))?;
    let logs = pods
        .log_stream(
            name,
            &LogParams {
                follow: true,
                ..LogParams::default()
            },
        )
        .await?;
    let events = launch.events.clone();
    tokio::spawn(async move {
        let mut lines = Box::pin(logs.lines());
        while let Ok(Some(line)) = lines.try_next().await {
            deliver(name, &line, &events);
        }
    });
    Ok(Worker::Pod { name, pods, uid })
}

/// Sets the freezer state of the pod's cgroup (every container of the pod) and waits until
/// the kernel reports it.
async fn freeze(uid: &str, state: &str) -> Result<()> {
    let dir =
        pod_cgroup(Path::new("/sys/fs/cgroup/freezer"), &format!("pod{uid}")).ok_or_else(|| {
            format!("no freezer cgroup for pod {uid} (cgroup v1, the node's machine, root)")
        })?;
    let file = dir.join("freezer.state");
    std::fs::write(&file, state)?;
    super::wait_until(Duration::from_secs(10), || async {
        std::fs::read_to_string(&file).is_ok_and(|s| s.trim() == state)
    })
    .await
}

/// The pod's cgroup under `root` with the cgroupfs driver: kubepods/[besteffort|burstable/]NAME.
fn pod_cgroup(root: &Path, name: &str) -> Option<PathBuf> {
    ["", "besteffort", "burstable"]
        .into_iter()
        .map(|qos| root.join("kubepods").join(qos).join(name))
        .find(|dir| dir.is_dir())
}
