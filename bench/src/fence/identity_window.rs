//! The identity rule's window: a grant that moves the lease from pod A to pod B written (its
//! status write answered) -> a write by pod A (a client with a token bound to pod A, as the pod
//! mounts) refused by the apiserver. The grant is written as the admin and goes from A to B and
//! back, so every sample is a hand-over; probes are dry-run creates of a ConfigMap, a kind the
//! lease fences. The pods stay Pending (no kubelet needed).

use std::io::Write;
use std::time::{Duration, Instant};

use fenced_lease::api::{FenceSpec, FencedLease};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Config};
use serde_json::json;

use super::{Log, in_namespace, report, slots};
use crate::figures::{Results, ms};
use crate::objects::dry_run;
use crate::pod_client::{PodRef, pod_config};
use crate::writers::{WRITER_ACCOUNT, until, writer_pods};
use crate::{Res, fail};

/// How long a call setting up the writer pods may take.
const SET_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// A pod the bench writes as: its name, its UID, and a client with a token bound to it.
struct WriterPod {
    name: String,
    uid: String,
    configmaps: Api<ConfigMap>,
}

/// Pods `writer-a` and `writer-b` of ServiceAccount `writer`, which may create ConfigMaps; a
/// client for each, kube's own as the admin's is.
async fn writers(client: &Client, ns: &str) -> Res<Vec<WriterPod>> {
    let mut writers = Vec::new();
    for (name, uid) in writer_pods(client, ns, SET_UP_TIMEOUT).await? {
        let pod = PodRef {
            namespace: ns,
            name: &name,
            uid: &uid,
            service_account: WRITER_ACCOUNT,
        };
        let config: Config = pod_config(client, pod, SET_UP_TIMEOUT).await?;
        writers.push(WriterPod {
            configmaps: Api::namespaced(Client::try_from(config)?, ns),
            name,
            uid,
        });
    }
    Ok(writers)
}

impl WriterPod {
    /// A dry-run create of a ConfigMap as this pod: whether the identity rule refused it.
    async fn refused(&self) -> Res<bool> {
        let probe = ConfigMap {
            metadata: ObjectMeta {
                name: Some("probe".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match self.configmaps.create(&dry_run(), &probe).await {
            Ok(_) => Ok(false),
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("does not hold") => {
                Ok(true)
            }
            Err(e) => Err(e.into()),
        }
    }
}

pub(super) async fn identity_window(
    client: &Client,
    samples: usize,
    log: &mut Log,
    results: &Results,
) -> Res<()> {
    in_namespace(client, |ns| async move {
        measure_identity_window(client, &ns, samples, log, results).await
    })
    .await
}

/// The status write a grant to `pod` is: holder and token.
async fn grant(
    leases: &Api<FencedLease>,
    pod: &WriterPod,
    token: i64,
) -> kube::Result<FencedLease> {
    let status = json!({"status": {
        "fencingToken": token,
        "holder": {
            "claim": pod.name, "claimUid": format!("claim-{token}"),
            "identity": pod.name, "podName": pod.name, "podUid": pod.uid,
        },
    }});
    leases
        .patch_status("ident", &PatchParams::default(), &Patch::Merge(status))
        .await
}

/// Lease `ident` fencing configmaps, held by the first pod, with the rule in force: the
/// holder may write and the other pod may not.
async fn in_force(client: &Client, ns: &str, writers: &[WriterPod]) -> Res<Api<FencedLease>> {
    let fence: FenceSpec =
        serde_json::from_value(json!({"resources": [{"resource": "configmaps"}]}))?;
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let lease: FencedLease = serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": "ident"}, "spec": {"fence": fence},
    }))?;
    leases.create(&PostParams::default(), &lease).await?;
    // The kinds slot the operator would list the namespace in, listed here so no operator is
    // needed (and unlisted when done).
    slots::list(client, ns, &fence.resources[0]).await?;
    // Warm up: the binding and the lease reach admission through informers, RBAC reaches the
    // authorizer; then the holder may write and the other pod may not.
    grant(&leases, &writers[0], 1).await?;
    let warm = Instant::now();
    loop {
        let holder_writes = matches!(writers[0].refused().await, Ok(false));
        if holder_writes && writers[1].refused().await? {
            return Ok(leases);
        }
        if warm.elapsed() > Duration::from_secs(30) {
            return fail("the identity rule was not in force within 30s");
        }
    }
}

async fn measure_identity_window(
    client: &Client,
    ns: &str,
    samples: usize,
    log: &mut Log,
    results: &Results,
) -> Res<()> {
    let writers = writers(client, ns).await?;
    let leases = in_force(client, ns, &writers).await?;
    let (mut windows, mut from_sent, mut round_trips) = (vec![], vec![], vec![]);
    let mut first_probe_refused = 0usize;
    for sample in 0..samples {
        let (old, new) = (&writers[sample % 2], &writers[(sample + 1) % 2]);
        let before = Instant::now();
        if old.refused().await? {
            return fail(format!(
                "pod {} refused before the lease moved on",
                old.name
            ));
        }
        let sent = Instant::now();
        grant(&leases, new, sample as i64 + 2).await?;
        let written = Instant::now();
        let gave_up = |_| "a write was still accepted 30s after the grant".to_string();
        let (window, probes) =
            until(written, Duration::from_secs(30), || old.refused(), gave_up).await?;
        first_probe_refused += usize::from(probes == 1);
        writeln!(
            log,
            "identity\t{sample}\t{:.3}\t{probes}\t{:.3}\t{:.3}",
            ms(window),
            ms(written - sent),
            ms(sent - before)
        )?;
        windows.push(window);
        from_sent.push(window + (written - sent));
        round_trips.push(sent - before);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let note = format!(
        "hand-overs between two pods, each way in turn; the first probe sent after the grant's write was answered was already refused in {first_probe_refused} of {samples}"
    );
    let system = "identity rule";
    let figure = "grant written -> old holder's pod refused";
    report(results, system, figure, &windows, &note);
    let figure = "grant sent -> old holder's pod refused";
    report(results, system, figure, &from_sent, "");
    let figure = "one write by the holder's pod";
    report(results, system, figure, &round_trips, "for scale");
    Ok(())
}
