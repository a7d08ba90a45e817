//! Whether a lease exists: the cache first, then the API.

use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use crate::context::Kube;
use crate::error::{Result, timed};
use crate::state::Memory;
use fenced_lease_api::FencedLease;

/// Does lease `ns/name` exist? A lease the cache has exists; one it lacks may have been
/// created a moment ago, so only the API may say it does not.
pub async fn lease_exists(kube: &Kube, memory: &Memory, ns: &str, name: &str) -> Result<bool> {
    if memory
        .leases
        .get(&ObjectRef::new(name).within(ns))
        .is_some()
    {
        return Ok(true);
    }
    let leases: Api<FencedLease> = Api::namespaced(kube.client.clone(), ns);
    let read = timed("read lease", kube.timeout, leases.get_metadata_opt(name));
    Ok(read.await?.is_some())
}
