//! How the operator names leases and claims: the key of a lease, object references.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::reflector::ObjectRef;

use fenced_lease_api::{FencedLease, FencedLeaseClaim};

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

/// One lease, by namespace and name: the key it is scheduled, timed, counted and kept under
/// wherever the operator keeps something per lease. One shared string, `namespace\0name` (no
/// Kubernetes namespace or name holds a NUL): a copy is a pointer, and thousands of leases kept
/// by key cost one allocation each. Not `ObjectRef::from_obj`, which also copies the UID and
/// resourceVersion (its equality ignores them anyway).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseKey(Arc<str>);

impl LeaseKey {
    pub fn new(ns: &str, name: &str) -> Self {
        LeaseKey(format!("{ns}\0{name}").into())
    }

    /// The key of `lease`.
    pub fn of(lease: &FencedLease) -> Self {
        let meta = &lease.metadata;
        Self::new(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }

    pub fn namespace(&self) -> &str {
        self.0.split_once('\0').map_or("", |(ns, _)| ns)
    }

    pub fn name(&self) -> &str {
        self.0.split_once('\0').map_or(&self.0, |(_, name)| name)
    }

    /// The lease's key in the lease cache.
    pub fn object_ref(&self) -> ObjectRef<FencedLease> {
        ObjectRef::new(self.name()).within(self.namespace())
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace(), self.name())
    }
}

impl fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_key_gives_back_its_namespace_and_name() {
        let key = LeaseKey::new("team-a", "db");
        assert_eq!((key.namespace(), key.name()), ("team-a", "db"));
        assert_eq!(key.to_string(), "team-a/db");
        assert_eq!(key.object_ref(), ObjectRef::new("db").within("team-a"));
        assert_ne!(
            key,
            LeaseKey::new("team-a/db", ""),
            "the separator is no name's"
        );
    }
}
