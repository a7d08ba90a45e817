//! A batch controller that works only while it leads, by fenced leader election on a
//! `FencedLease`. Every ConfigMap it writes is labelled with the lease and stamped with its
//! fencing token, so that the apiserver (with the policies of `deploy/admission/`) refuses the
//! writes of a leader that stalled past its lease and was replaced.
//!
//! ```console
//! $ kubectl apply -f - <<< '{"apiVersion":"fencing.dev/v1alpha1","kind":"FencedLease","metadata":{"name":"batch"},"spec":{"fenceObjects":true}}'
//! $ cargo run --example batch-controller -- --lease batch --batches 5
//! ```
//! Run two: one leads, the other waits; stop the leader and the other takes over with a
//! larger token.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Parser;
use fenced_lease::api::{LEASE_LABEL, TOKEN_ANNOTATION};
use fenced_lease::holder::{AcquireOptions, ElectOptions, LeaseHandle, elect};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Args {
    /// Namespace of the lease and of the ConfigMaps.
    #[arg(short = 'n', long, default_value = "default")]
    namespace: String,
    /// The FencedLease to lead by.
    #[arg(long, default_value = "batch-controller")]
    lease: String,
    /// Identity of this replica (default: $POD_NAME, else the hostname).
    #[arg(long)]
    identity: Option<String>,
    /// Time between batches.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// Step down after this many batches (0: lead until stopped).
    #[arg(long, default_value_t = 0)]
    batches: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let client = Client::try_default().await?;
    let shutdown = CancellationToken::new();
    let on_ctrl_c = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_ctrl_c.cancel();
    });

    let options = ElectOptions {
        acquire: AcquireOptions {
            identity: args.identity.clone(),
            ..Default::default()
        },
        shutdown,
    };
    elect(
        client.clone(),
        &args.namespace,
        &args.lease,
        options,
        |leader| {
            let (client, interval, batches) = (client.clone(), args.interval, args.batches);
            async move {
                if let Err(error) = lead(client, &leader, interval, batches).await {
                    tracing::warn!(%error, "stopped leading");
                }
            }
        },
    )
    .await?;
    Ok(())
}

/// One term as leader: write a batch result per interval, each stamped with the token.
async fn lead(
    client: Client,
    leader: &LeaseHandle,
    interval: Duration,
    batches: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client, leader.namespace());
    let stopped = leader.cancellation();
    let mut batch = 0u64;
    loop {
        // Never write without a live token: past the local safe deadline this fails.
        let token = leader.token()?;
        let name = format!("{}-batch-{batch}", leader.lease());
        let result = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([(
                    LEASE_LABEL.into(),
                    leader.lease().into(),
                )])),
                annotations: Some(BTreeMap::from([(
                    TOKEN_ANNOTATION.into(),
                    token.to_string(),
                )])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([
                ("batch".into(), batch.to_string()),
                ("writer".into(), leader.identity().into()),
            ])),
            ..Default::default()
        };
        let (params, patch) = (
            PatchParams::apply("batch-controller").force(),
            Patch::Apply(&result),
        );
        tokio::select! {
            written = config_maps.patch(&name, &params, &patch) => { written?; }
            _ = stopped.cancelled() => return Ok(()),
        }
        tracing::info!(configmap = %name, token, "batch written");
        batch += 1;
        if batches > 0 && batch >= batches {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stopped.cancelled() => return Ok(()),
        }
    }
}
