//! The token records: the last token issued under each lease name, kept in a ConfigMap of the
//! operator's own namespace, one per lease namespace: `fenced-lease-tokens.<namespace>`, key
//! `<lease>`. The finalizer writes a lease's record before the lease goes; a lease re-created
//! under that name starts above it. A ConfigMap is a core object outside the leases'
//! namespaces, so the record survives the CRDs being uninstalled and the lease's namespace
//! being deleted.
//!
//! The record is the second line of defence: tokens are also never below the wall-clock
//! time of their grant (see [`crate::core::token`]), so a lease re-created after the record is
//! lost too (deleted, left behind in another namespace, the finalizer stripped) still starts
//! above its past. That covers only the tokens the clock had reached when they were issued; a
//! token above the clock (a `minToken` or a record above it) is recorded here *before* its
//! grant is written ([`record_ahead`]; [`crate::core::step`], step 6), so a finalizer stripped
//! later cannot take it. A record that cannot be read is never taken as zero: the lease waits,
//! with a condition and a Warning Event, until someone repairs or deletes it. Records older
//! than [`PRUNE_AFTER_MS`] by the clock are dropped when a record is written: the clock covers
//! them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::context::Context;
use crate::error::{Error, Result, timed};
use crate::state::locked;
use crate::state::records::raise;

/// Prefix of the ConfigMaps (in the operator's namespace) holding the last token of each
/// deleted lease; the lease's namespace follows.
pub const CONFIG_MAP_PREFIX: &str = "fenced-lease-tokens.";
/// A record whose token is older than this by the wall clock (tokens are at least the
/// grant's time in ms) adds nothing to the clock floor and is dropped: 24 hours.
pub const PRUNE_AFTER_MS: i64 = 24 * 3600 * 1000;

/// The ConfigMap holding the records of namespace `ns` (a DNS label, so the name is valid).
pub fn config_map_name(ns: &str) -> String {
    format!("{CONFIG_MAP_PREFIX}{ns}")
}

/// Parses a recorded token: decimal digits only, nothing around them. Anything else is a
/// damaged record, reported, never read as zero.
pub fn parse_record(value: &str) -> Result<i64, String> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{value:?} is not a decimal token"));
    }
    value
        .parse()
        .map_err(|e| format!("{value:?} is not a token: {e}"))
}

fn record_of(cm: &ConfigMap, lease: &str) -> Result<i64> {
    let Some(value) = cm.data.as_ref().and_then(|d| d.get(lease)) else {
        return Ok(0);
    };
    parse_record(value).map_err(|reason| Error::TokenRecord {
        record: format!(
            "ConfigMap {} key {lease}",
            cm.metadata.name.as_deref().unwrap_or_default()
        ),
        reason,
    })
}

/// The recorded high-water mark of lease `ns/name`, 0 when none. Read from the API, not a cache.
pub async fn read(ctx: &Context, ns: &str, name: &str) -> Result<i64> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.kube.client.clone(), &ctx.state_namespace);
    let cm = timed(
        "read token record",
        ctx.kube.timeout,
        api.get_opt(&config_map_name(ns)),
    )
    .await?;
    cm.map_or(Ok(0), |cm| record_of(&cm, name))
}

/// The records after raising `lease` to `token` (never lowering it) at wall-clock `now_ms`,
/// without those the clock covers; `None` when nothing changes.
pub fn raised(
    data: &BTreeMap<String, String>,
    lease: &str,
    token: i64,
    now_ms: i64,
) -> Option<BTreeMap<String, String>> {
    let kept = |value: &String| parse_record(value).map_or(true, |t| t > now_ms - PRUNE_AFTER_MS);
    let mut next: BTreeMap<String, String> = data
        .iter()
        .filter(|(key, value)| key.as_str() == lease || kept(value))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let recorded = next
        .get(lease)
        .and_then(|v| parse_record(v).ok())
        .unwrap_or(0);
    if recorded < token {
        next.insert(lease.to_string(), token.to_string());
    }
    (&next != data).then_some(next)
}

/// Raises the recorded mark of `ns/name` to `token` (never lowers it). The write is shared
/// with every record of the namespace queued meanwhile; optimistic, retried on 409. A
/// damaged record of this lease is an error: overwriting it could lower it.
pub async fn record(ctx: &Context, ns: &str, name: &str, token: i64) -> Result<()> {
    record_with(ctx, ns, name, token, false).await
}

/// [`record`], and with `overwrite_damaged` a damaged record of `name` overwritten with `token`
/// instead of an error (see [`record_ahead`]).
async fn record_with(
    ctx: &Context,
    ns: &str,
    name: &str,
    token: i64,
    overwrite_damaged: bool,
) -> Result<()> {
    let queue = ctx.records.queue(ns);
    raise(&mut locked(&queue.queued), name, token);
    let _turn = queue.turn.lock().await;
    {
        let mut written = locked(&queue.written);
        if written.get(name).is_some_and(|t| *t >= token) {
            written.remove(name);
            return Ok(());
        }
    }
    // Ours is in the batch even if a turn that took it was dropped before it wrote.
    let mut batch = std::mem::take(&mut *locked(&queue.queued));
    raise(&mut batch, name, token);
    let overwrite = overwrite_damaged.then_some(name);
    match write_records(ctx, ns, &batch, overwrite).await {
        Ok(mut damaged) => {
            {
                let mut written = locked(&queue.written);
                for (lease, t) in &batch {
                    if lease != name && !damaged.contains_key(lease) {
                        raise(&mut written, lease, *t);
                    }
                }
            }
            // A damaged record is its own lease's error (its caller finds it, not written,
            // and meets it on its own turn); the others are written.
            damaged.remove(name).map_or(Ok(()), Err)
        }
        Err(e) => {
            let mut queued = locked(&queue.queued);
            for (lease, t) in batch {
                if lease != name {
                    raise(&mut queued, &lease, t);
                }
            }
            Err(e)
        }
    }
}

/// Records `token`, about to be granted by the live lease `ns/name` above the wall clock, before
/// it is issued (see the module). Unlike a finalizer's record, a damaged record of this lease is
/// overwritten: while the lease object exists only this function writes its key, the lease
/// started above what the key held when it was first read (its first grant rested on it), and
/// `token` is above every token the lease issued since, so the key can only rise.
pub async fn record_ahead(ctx: &Context, ns: &str, name: &str, token: i64) -> Result<()> {
    record_with(ctx, ns, name, token, true).await
}
/// Writes `batch` into the ConfigMap of namespace `ns` in one update; the leases whose
/// record is damaged are left as they are and returned, each with its error, except
/// `overwrite`, whose damaged record is replaced by its token.
async fn write_records(
    ctx: &Context,
    ns: &str,
    batch: &BTreeMap<String, i64>,
    overwrite: Option<&str>,
) -> Result<BTreeMap<String, Error>> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.kube.client.clone(), &ctx.state_namespace);
    let cm_name = config_map_name(ns);
    for _ in 0..10 {
        let now_ms = k8s_openapi::jiff::Timestamp::now().as_millisecond();
        let current = timed("read token record", ctx.kube.timeout, api.get_opt(&cm_name)).await?;
        let (result, damaged) = match current {
            None => {
                let created = timed(
                    "create token record",
                    ctx.kube.timeout,
                    api.create(&PostParams::default(), &new_records(&cm_name, batch)),
                )
                .await;
                (created.map(drop), BTreeMap::new())
            }
            Some(mut cm) => {
                let (data, damaged) = merged(&cm, batch, overwrite, ns, now_ms);
                if cm.data.as_ref().map_or(data.is_empty(), |d| *d == data) {
                    return Ok(damaged);
                }
                cm.data = Some(data);
                let replaced = timed(
                    "update token record",
                    ctx.kube.timeout,
                    api.replace(&cm_name, &PostParams::default(), &cm),
                )
                .await;
                (replaced.map(drop), damaged)
            }
        };
        match result {
            Ok(()) => return Ok(damaged),
            Err(e) if e.is_conflict() => continue, // changed meanwhile, or created by another replica
            Err(e) => return Err(e),
        }
    }
    Err(Error::Contended(format!(
        "{}/{cm_name}",
        ctx.state_namespace
    )))
}

/// The ConfigMap `name` holding just the records of `batch`.
fn new_records(name: &str, batch: &BTreeMap<String, i64>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "fenced-lease-operator".to_string(),
            )])),
            ..Default::default()
        },
        data: Some(
            batch
                .iter()
                .map(|(lease, token)| (lease.clone(), token.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

/// The records of `cm` (of lease namespace `ns`) with those of `batch` raised in them at
/// wall-clock `now_ms`, and the leases of `batch` whose record is damaged, each with its error:
/// those are left as they are, except `overwrite`, whose damaged record is replaced.
fn merged(
    cm: &ConfigMap,
    batch: &BTreeMap<String, i64>,
    overwrite: Option<&str>,
    ns: &str,
    now_ms: i64,
) -> (BTreeMap<String, String>, BTreeMap<String, Error>) {
    let mut damaged = BTreeMap::new();
    let mut data = cm.data.clone().unwrap_or_default();
    for (lease, token) in batch {
        if let Err(e) = record_of(cm, lease) {
            if overwrite != Some(lease.as_str()) {
                damaged.insert(lease.clone(), e);
                continue;
            }
            tracing::warn!(%lease, namespace = %ns, error = %e, token,
                "the lease's token record was damaged; overwriting it with the token about to be granted");
        }
        if let Some(next) = raised(&data, lease, *token, now_ms) {
            data = next;
        }
    }
    (data, damaged)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_764_500_000_000;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn damaged_records_are_errors_not_zero() {
        assert_eq!(parse_record("51"), Ok(51));
        for bad in ["51\n", " 51", "", "-3", "5e3", "x"] {
            assert!(parse_record(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_record_is_raised_never_lowered() {
        let d = data(&[("a", &(NOW + 9).to_string())]);
        assert_eq!(raised(&d, "a", NOW + 5, NOW), None);
        let up = raised(&d, "a", NOW + 12, NOW).unwrap();
        assert_eq!(up["a"], (NOW + 12).to_string());
    }

    #[test]
    fn records_the_clock_covers_are_dropped() {
        let old = (NOW - PRUNE_AFTER_MS - 1).to_string();
        let recent = (NOW - 1000).to_string();
        let d = data(&[("old", &old), ("recent", &recent), ("bad", "x")]);
        let next = raised(&d, "new", NOW, NOW).unwrap();
        assert!(!next.contains_key("old"));
        assert_eq!(next["recent"], recent);
        assert_eq!(next["bad"], "x", "a damaged record is left for a human");
        assert_eq!(next["new"], NOW.to_string());
    }
}
