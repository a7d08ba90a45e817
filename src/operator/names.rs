//! How the operator names leases and claims: queue keys, joined names, object references.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::reflector::ObjectRef;

use kube::Resource;

use crate::api::{FencedLease, FencedLeaseClaim};

/// Field manager of the operator's claim status writes (JSON merge patches that name every
/// field).
pub const MANAGER: &str = "fenced-lease-operator";

/// A reference to claim `name` (uid `uid`) in namespace `ns`.
pub fn claim_reference(ns: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(FencedLeaseClaim::api_version(&()).into_owned()),
        kind: Some(FencedLeaseClaim::kind(&()).into_owned()),
        namespace: Some(ns.into()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        ..Default::default()
    }
}

/// The key a lease is queued and scheduled under: its namespace and name only. Not
/// `ObjectRef::from_obj`, which also copies its UID and resourceVersion, two more strings in
/// each of the controller's timers (the key's equality ignores them anyway).
pub fn lease_key(lease: &FencedLease) -> ObjectRef<FencedLease> {
    let key = ObjectRef::new(lease.metadata.name.as_deref().unwrap_or_default());
    match lease.metadata.namespace.as_deref() {
        Some(ns) => key.within(ns),
        None => key,
    }
}

/// A lease's namespace and name as one string, `namespace\0name` (no Kubernetes namespace or
/// name holds a NUL): one allocation a lease where thousands of leases are kept by name.
pub fn joined_name(ns: &str, name: &str) -> String {
    format!("{ns}\0{name}")
}

/// The namespace and name of a [`joined_name`].
pub fn split_name(joined: &str) -> Option<(&str, &str)> {
    joined.split_once('\0')
}
