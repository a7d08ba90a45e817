//! The coordination Lease a FencedLease follows (`spec.follow`), as the decision needs it:
//! from the cache for deciding, from the API before the holder changes (see
//! [`crate::core::step`]), and its holder resolved to a pod of the namespace.

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::context::Kube;
use crate::core::follow::Followed;
use crate::error::{Result, timed};
use crate::state::Memory;
use crate::state::followed::CachedLease;
use fenced_lease_api::FollowedTerm;

/// The followed Lease `ns/name` as the caches have it.
pub fn cached(memory: &Memory, ns: &str, name: &str) -> Followed {
    let lease = memory.followed.get(ns, name);
    resolve(memory, lease.as_deref())
}

/// The followed Lease `ns/name` as the API has it now.
pub async fn read(kube: &Kube, memory: &Memory, ns: &str, name: &str) -> Result<Followed> {
    let api: Api<Lease> = Api::namespaced(kube.client.clone(), ns);
    let read = timed("read followed Lease", kube.timeout, api.get_opt(name)).await?;
    Ok(resolve(memory, read.map(CachedLease::from_lease).as_ref()))
}

/// The Lease's term and holder, and the pod its holder identity names: the first of its
/// [`pod names`](CachedLease::holder_pods) that exists in the pod cache.
fn resolve(memory: &Memory, lease: Option<&CachedLease>) -> Followed {
    let Some(lease) = lease else {
        return Followed::Missing;
    };
    let sought = lease.holder_pods();
    let pod = sought.iter().find_map(|name| {
        let pod = memory.pods.get(&lease.namespace, name)?;
        Some((pod.name.clone(), pod.uid.clone()?))
    });
    Followed::Lease {
        term: FollowedTerm {
            name: lease.name.clone(),
            uid: lease.uid.clone(),
            lease_transitions: lease.transitions,
        },
        identity: lease.holder.clone(),
        pod,
        sought,
    }
}
