//! Keeps each lease's fence bindings (see [`core::fence`](crate::operator::core::fence)) in
//! line with its spec: applied while asked for, deleted when not or when the lease goes.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use crate::api::FencedLease;
use crate::fence::kube::LEASE_POLICY;
use crate::operator::context::Context;
use crate::operator::core::fence::{desired_bindings, is_current};
use crate::operator::error::{Error, Result, timed};

/// Brings the bindings of `lease` in line with its spec: each applied while its field is
/// set, deleted when it is not or the lease is being deleted. Returns when the bindings it
/// keeps are in force, if that is still to come: one created or restored less than
/// [`BINDING_SETTLE`] ago may not be enforced yet.
pub async fn sync(ctx: &Context, lease: &FencedLease) -> Result<Option<Instant>> {
    let ns = lease
        .namespace()
        .ok_or_else(|| Error::Unexpected("FencedLease without a namespace".into()))?;
    let name = lease.name_any();
    let mut in_force = None;
    for (binding, desired, asked) in desired_bindings(&ns, &name, lease) {
        let cached = ctx.fence_bindings.cached(&binding);
        match desired {
            Some(desired) => {
                apply(ctx, lease, cached, desired).await?;
                in_force = in_force.max(ctx.fence_bindings.settling(&binding));
            }
            // Leases that never fence objects cost no call, and no RBAC rule.
            None if cached.is_some() || asked => remove(ctx, &ns, &name, &binding).await?,
            None => {}
        }
    }
    Ok(in_force)
}

/// Creates `desired`, or puts it back whole over an edited copy.
async fn apply(
    ctx: &Context,
    lease: &FencedLease,
    cached: Option<Arc<ValidatingAdmissionPolicyBinding>>,
    desired: ValidatingAdmissionPolicyBinding,
) -> Result<()> {
    if cached.as_deref().is_some_and(|b| is_current(b, &desired)) {
        return Ok(());
    }
    let api: Api<ValidatingAdmissionPolicyBinding> = Api::all(ctx.kube.client.clone());
    let binding = desired.name_any();
    // The operator owns the whole binding: created, and put back whole (a replace on the
    // resourceVersion it read, not a merge that would keep someone else's list items)
    // when edited by hand. A binding the API has but the cache has not seen yet makes
    // the create 409: the watch brings it, and the lease is reconciled again.
    match &cached {
        None => timed(
            "create fence binding",
            ctx.kube.timeout,
            api.create(&PostParams::default(), &desired),
        )
        .await
        .map(drop),
        Some(current) => {
            let mut next = desired;
            next.metadata.resource_version = current.metadata.resource_version.clone();
            timed(
                "restore fence binding",
                ctx.kube.timeout,
                api.replace(&binding, &PostParams::default(), &next),
            )
            .await
            .map(drop)
        }
    }?;
    ctx.fence_bindings.wrote(&binding);
    info!(lease = %lease.name_any(), binding = %binding, "fence binding applied");
    if cached.is_none() {
        warn_if_policy_missing(ctx, lease).await;
    }
    Ok(())
}

async fn remove(ctx: &Context, ns: &str, name: &str, binding: &str) -> Result<()> {
    let api: Api<ValidatingAdmissionPolicyBinding> = Api::all(ctx.kube.client.clone());
    match timed(
        "delete fence binding",
        ctx.kube.timeout,
        api.delete(binding, &DeleteParams::default()),
    )
    .await
    {
        Ok(_) => {
            info!(lease = %name, namespace = %ns, binding = %binding, "fence binding deleted")
        }
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e),
    }
    Ok(())
}

/// A binding of a policy that is not installed enforces nothing: say so on the lease.
async fn warn_if_policy_missing(ctx: &Context, lease: &FencedLease) {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(ctx.kube.client.clone());
    if let Ok(None) = timed(
        "read fence policy",
        ctx.kube.timeout,
        policies.get_opt(LEASE_POLICY),
    )
    .await
    {
        let note = format!(
            "the lease fences objects (spec.fenceObjects or spec.fence), but ValidatingAdmissionPolicy {LEASE_POLICY} is not installed (deploy/admission/fence-policy.yaml): objects are not fenced by this lease"
        );
        warn!(lease = %lease.name_any(), "{note}");
        ctx.events.event(
            &lease.object_ref(&()),
            EventType::Warning,
            "FencePolicyMissing",
            "FenceObjects",
            note,
        );
    }
}
