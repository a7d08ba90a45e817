//! A lease's token record read ahead of its first grant: when the lease is first seen, as its
//! finalizer is added, off the path of its first claim (see
//! [`RecordsAhead`](crate::state::RecordsAhead)), and taken by that grant.

use kube::ResourceExt;

use super::records;
use crate::context::Context;
use crate::error::Result;
use fenced_lease_api::FencedLease;

/// Reads the record of a lease that has issued no token yet, ahead of its first grant (see
/// [`RecordsAhead`](crate::state::RecordsAhead)). A failed read is left for that
/// grant to meet: it reads again, and reports it.
pub async fn read(ctx: &Context, lease: &FencedLease) {
    let issued = lease.status.as_ref().is_some_and(|s| s.fencing_token > 0);
    let Some(uid) = lease.metadata.uid.as_deref() else {
        return;
    };
    if issued || ctx.records_ahead.get(uid).is_some() {
        return;
    }
    let (ns, name) = (lease.namespace().unwrap_or_default(), lease.name_any());
    match records::read(ctx, &ns, &name).await {
        Ok(record) => ctx.records_ahead.keep(uid, record),
        Err(error) => {
            tracing::debug!(lease = %name, namespace = %ns, %error, "could not read the token record ahead")
        }
    }
}

/// Forgets the record read ahead for `lease`: it has issued a token (the next one continues
/// from its status), or it is gone.
pub fn forget(ctx: &Context, lease: &FencedLease) {
    if let Some(uid) = lease.metadata.uid.as_deref() {
        ctx.records_ahead.forget(uid);
    }
}

/// The record before lease's first grant: the one read ahead, or else read now.
pub async fn before_first_grant(ctx: &Context, lease: &FencedLease) -> Result<i64> {
    let ahead = lease
        .metadata
        .uid
        .as_deref()
        .and_then(|uid| ctx.records_ahead.get(uid));
    if let Some(record) = ahead {
        return Ok(record);
    }
    let (ns, name) = (lease.namespace().unwrap_or_default(), lease.name_any());
    records::read(ctx, &ns, &name).await
}
