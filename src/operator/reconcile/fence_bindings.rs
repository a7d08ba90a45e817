//! Keeps each lease's fence bindings (see [`core::fence`](crate::operator::core::fence)), and
//! the policies of its kinds binding, in line with its spec: applied while asked for, deleted
//! when not or when the lease goes.

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
use crate::operator::core::fence::{
    Wanted, binding_name, desired_bindings, is_current, kinds_binding_name,
};
use crate::operator::core::fence_policy::{self, desired_kinds_policy};
use crate::operator::error::{Error, Result, timed};
use crate::operator::state::bindings::{FenceObject, FenceObjects};

/// Brings the bindings of `lease` in line with its spec: each applied while its field is
/// set, deleted when it is not or the lease is being deleted; a kinds binding's own policy
/// is applied before it and deleted after it. Whether what it wrote is in force yet is
/// [`settling`]'s to say.
pub async fn sync(ctx: &Context, lease: &FencedLease) -> Result<()> {
    let ns = lease
        .namespace()
        .ok_or_else(|| Error::Unexpected("FencedLease without a namespace".into()))?;
    let name = lease.name_any();
    for wanted in desired_bindings(&ns, &name, lease) {
        let Wanted {
            name: object,
            binding,
            asked,
            own_policy,
        } = wanted;
        let cached = ctx.fence_bindings.cached(&object);
        let cached_policy = own_policy
            .then(|| ctx.fence_policies.cached(&object))
            .flatten();
        match binding {
            Some(desired) => {
                if let Some(fence) = lease.spec.fence.as_ref().filter(|_| own_policy) {
                    let policy =
                        desired_kinds_policy(&ns, &name, fence).map_err(Error::Unexpected)?;
                    let policies = &ctx.fence_policies;
                    put(
                        ctx,
                        lease,
                        policies,
                        cached_policy,
                        policy,
                        fence_policy::is_current,
                    )
                    .await?;
                }
                let bindings = &ctx.fence_bindings;
                let fresh = cached.is_none();
                put(ctx, lease, bindings, cached, desired, is_current).await?;
                if fresh && !own_policy {
                    warn_if_policy_missing(ctx, lease).await;
                }
            }
            // Leases that never fence objects cost no call, and no RBAC rule.
            None if cached.is_some() || cached_policy.is_some() || asked => {
                remove::<ValidatingAdmissionPolicyBinding>(ctx, &ns, &name, &object).await?;
                if own_policy {
                    remove::<ValidatingAdmissionPolicy>(ctx, &ns, &name, &object).await?;
                }
            }
            None => {}
        }
    }
    Ok(())
}

/// When the fence objects of `lease` that this process created or restored last are in force,
/// if that is still to come: one written less than
/// [`BINDING_SETTLE`](crate::operator::core::fence::BINDING_SETTLE) ago may not be enforced
/// yet. Asked whatever [`sync`] returned: a sync that failed after writing one (a create that
/// met the object its cache has not seen yet, 409) must hold up the grant as well.
pub fn settling(ctx: &Context, lease: &FencedLease) -> Option<Instant> {
    let ns = lease.namespace()?;
    let name = lease.name_any();
    [binding_name(&ns, &name), kinds_binding_name(&ns, &name)]
        .iter()
        .flat_map(|object| {
            [
                ctx.fence_bindings.settling(object),
                ctx.fence_policies.settling(object),
            ]
        })
        .flatten()
        .max()
}

/// Creates `desired`, or puts it back whole over an edited copy.
async fn put<K: FenceObject>(
    ctx: &Context,
    lease: &FencedLease,
    cache: &FenceObjects<K>,
    cached: Option<Arc<K>>,
    desired: K,
    is_current: fn(&K, &K) -> bool,
) -> Result<()> {
    if cached.as_deref().is_some_and(|c| is_current(c, &desired)) {
        return Ok(());
    }
    let api: Api<K> = Api::all(ctx.kube.client.clone());
    let object = desired.name_any();
    let kind = K::kind(&());
    // The operator owns the whole object: created, and put back whole (a replace on the
    // resourceVersion it read, not a merge that would keep someone else's list items)
    // when edited by hand. One the API has but the cache has not seen yet makes the create
    // 409: the watch brings it, and the lease is reconciled again.
    match &cached {
        None => timed(
            "create fence object",
            ctx.kube.timeout,
            api.create(&PostParams::default(), &desired),
        )
        .await
        .map(drop),
        Some(current) => {
            let mut next = desired;
            next.meta_mut().resource_version = current.meta().resource_version.clone();
            timed(
                "restore fence object",
                ctx.kube.timeout,
                api.replace(&object, &PostParams::default(), &next),
            )
            .await
            .map(drop)
        }
    }?;
    cache.wrote(&object);
    info!(lease = %lease.name_any(), %kind, name = %object, "fence object applied");
    Ok(())
}

/// Does the cache show any admission object of lease `ns/name`?
pub fn any_cached(ctx: &Context, ns: &str, name: &str) -> bool {
    let kinds = kinds_binding_name(ns, name);
    ctx.fence_bindings.cached(&binding_name(ns, name)).is_some()
        || ctx.fence_bindings.cached(&kinds).is_some()
        || ctx.fence_policies.cached(&kinds).is_some()
}

/// Deletes every admission object of lease `ns/name` (bindings before the policy they use).
pub async fn remove_all(ctx: &Context, ns: &str, name: &str) -> Result<()> {
    for object in [binding_name(ns, name), kinds_binding_name(ns, name)] {
        remove::<ValidatingAdmissionPolicyBinding>(ctx, ns, name, &object).await?;
    }
    remove::<ValidatingAdmissionPolicy>(ctx, ns, name, &kinds_binding_name(ns, name)).await
}

async fn remove<K: FenceObject>(ctx: &Context, ns: &str, name: &str, object: &str) -> Result<()> {
    let api: Api<K> = Api::all(ctx.kube.client.clone());
    let kind = K::kind(&());
    match timed(
        "delete fence object",
        ctx.kube.timeout,
        api.delete(object, &DeleteParams::default()),
    )
    .await
    {
        Ok(_) => {
            info!(lease = %name, namespace = %ns, %kind, name = %object, "fence object deleted")
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
            "the lease fences labelled objects (spec.fenceObjects), but ValidatingAdmissionPolicy {LEASE_POLICY} is not installed (deploy/admission/fence-policy.yaml): they are not fenced by this lease"
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
