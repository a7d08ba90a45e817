//! Tokens outlive their lease object. Before a FencedLease goes, its finalizer records the
//! last token issued under its name in the ConfigMap `fenced-lease-tokens` of the operator's
//! own namespace (key `<namespace>.<lease>`); a lease re-created under that name starts above
//! it. A ConfigMap is a core object outside the leases' namespaces, so the record survives
//! the CRDs being uninstalled and installed again, and the lease's namespace being deleted.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use super::context::Context;
use super::error::{Error, Result, timed};
use crate::api::FencedLease;

/// Finalizer that records the lease's last token before it is deleted.
pub const FINALIZER: &str = "fencing.dev/token-high-water-mark";
/// ConfigMap (in the operator's namespace) holding the last token of each deleted lease.
pub const CONFIG_MAP: &str = "fenced-lease-tokens";

pub fn has_finalizer(lease: &FencedLease) -> bool {
    lease
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}

/// The ConfigMap key of lease `name` in namespace `ns` (both DNS names, so the key is valid).
pub fn key(ns: &str, name: &str) -> String {
    format!("{ns}.{name}")
}

/// The recorded high-water mark of lease `ns/name`, 0 when none. Read from the API, not a cache.
pub async fn read(ctx: &Context, ns: &str, name: &str) -> Result<i64> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.state_namespace);
    let cm = timed(
        "read token high-water mark",
        ctx.api_timeout,
        api.get_opt(CONFIG_MAP),
    )
    .await?;
    Ok(cm
        .and_then(|cm| cm.data?.get(&key(ns, name))?.parse().ok())
        .unwrap_or(0))
}

/// Raises the recorded mark of `ns/name` to `token` (never lowers it). Optimistic: retried on 409.
pub async fn record(ctx: &Context, ns: &str, name: &str, token: i64) -> Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.state_namespace);
    let name = key(ns, name);
    let name = name.as_str();
    for _ in 0..10 {
        let current = timed(
            "read token high-water mark",
            ctx.api_timeout,
            api.get_opt(CONFIG_MAP),
        )
        .await?;
        let result = match current {
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(CONFIG_MAP.into()),
                        ..Default::default()
                    },
                    data: Some(BTreeMap::from([(name.to_string(), token.to_string())])),
                    ..Default::default()
                };
                timed(
                    "create token high-water mark",
                    ctx.api_timeout,
                    api.create(&PostParams::default(), &cm),
                )
                .await
                .map(drop)
            }
            Some(mut cm) => {
                let data = cm.data.get_or_insert_with(BTreeMap::new);
                let recorded = data
                    .get(name)
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or(0);
                if recorded >= token {
                    return Ok(());
                }
                data.insert(name.to_string(), token.to_string());
                timed(
                    "update token high-water mark",
                    ctx.api_timeout,
                    api.replace(CONFIG_MAP, &PostParams::default(), &cm),
                )
                .await
                .map(drop)
            }
        };
        match result {
            Ok(()) => return Ok(()),
            Err(e) if e.is_conflict() => continue, // changed meanwhile, or created by another replica
            Err(e) => return Err(e),
        }
    }
    Err(Error::Contended(format!("{ns}/{CONFIG_MAP}")))
}

/// Adds the finalizer, guarded by the lease's resourceVersion so no other finalizer is lost.
pub async fn add_finalizer(
    ctx: &Context,
    api: &Api<FencedLease>,
    lease: &FencedLease,
) -> Result<()> {
    let mut finalizers = lease.metadata.finalizers.clone().unwrap_or_default();
    finalizers.push(FINALIZER.to_string());
    patch_finalizers(ctx, api, lease, finalizers).await
}

/// Removes the finalizer (idempotent), guarded by the lease's resourceVersion.
pub async fn remove_finalizer(
    ctx: &Context,
    api: &Api<FencedLease>,
    lease: &FencedLease,
) -> Result<()> {
    if !has_finalizer(lease) {
        return Ok(());
    }
    let finalizers: Vec<String> = lease
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    patch_finalizers(ctx, api, lease, finalizers).await
}

async fn patch_finalizers(
    ctx: &Context,
    api: &Api<FencedLease>,
    lease: &FencedLease,
    finalizers: Vec<String>,
) -> Result<()> {
    let name = lease.metadata.name.clone().unwrap_or_default();
    let patch = json!({ "metadata": { "finalizers": finalizers, "resourceVersion": lease.metadata.resource_version } });
    match timed(
        "patch lease finalizers",
        ctx.api_timeout,
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}
