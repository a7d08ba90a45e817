//! Coordination Leases as the operator caches them: only those a FencedLease may follow
//! (`spec.follow`), and of each only what says who holds it.

use k8s_openapi::api::coordination::v1::Lease;

use crate::state::cache::Keyed;

/// What the operator keeps of a `coordination.k8s.io/v1` Lease: who holds it, and how many
/// times it changed hands. Renewals (`renewTime`) are not kept: they change nothing here, so a
/// renewal is recognised as such and reconciles nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CachedLease {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// `spec.holderIdentity`; `None` when unset or empty (client-go's release writes `""`).
    pub holder: Option<String>,
    /// `spec.leaseTransitions` (0 when unset).
    pub transitions: i64,
}

impl CachedLease {
    pub fn from_lease(lease: Lease) -> Self {
        let meta = lease.metadata;
        let spec = lease.spec.unwrap_or_default();
        Self {
            name: meta.name.unwrap_or_default(),
            namespace: meta.namespace.unwrap_or_default(),
            uid: meta.uid.unwrap_or_default(),
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            transitions: spec.lease_transitions.map_or(0, i64::from),
        }
    }

    /// Names of the pods its holder may be (see [`pod_names`]).
    pub fn holder_pods(&self) -> Vec<String> {
        self.holder.as_deref().map(pod_names).unwrap_or_default()
    }
}

/// The pod names a holder identity may stand for: the identity itself, and the part before
/// its first `_` (controller-runtime and many client-go programs write `<hostname>_<uuid>`;
/// a pod's hostname is its name, and no pod name holds a `_`). The exact name first.
pub fn pod_names(identity: &str) -> Vec<String> {
    let mut names = vec![identity.to_owned()];
    if let Some((host, _)) = identity.split_once('_')
        && !host.is_empty()
    {
        names.push(host.to_owned());
    }
    names
}

impl Keyed for CachedLease {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_holder_identity_stands_for_its_whole_self_or_the_hostname_before_an_underscore() {
        assert_eq!(pod_names("ctrl-7d9f-abcde"), vec!["ctrl-7d9f-abcde"]);
        assert_eq!(
            pod_names("ctrl-7d9f-abcde_0f3c1a2e-1111-2222-3333-444455556666"),
            vec![
                "ctrl-7d9f-abcde_0f3c1a2e-1111-2222-3333-444455556666",
                "ctrl-7d9f-abcde"
            ]
        );
        assert_eq!(pod_names("_x"), vec!["_x"]);
    }

    #[test]
    fn a_cached_lease_keeps_its_holder_and_transitions_only() {
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": "ctrl", "namespace": "ns", "uid": "u-1", "resourceVersion": "9"},
            "spec": {"holderIdentity": "web-0_abc", "leaseTransitions": 3,
                     "leaseDurationSeconds": 15, "renewTime": "2026-12-04T10:00:00.000000Z"}
        }))
        .unwrap();
        let cached = CachedLease::from_lease(lease);
        assert_eq!(
            cached,
            CachedLease {
                name: "ctrl".into(),
                namespace: "ns".into(),
                uid: "u-1".into(),
                holder: Some("web-0_abc".into()),
                transitions: 3,
            }
        );
        let released: Lease = serde_json::from_value(json!({
            "metadata": {"name": "ctrl", "namespace": "ns", "uid": "u-1"},
            "spec": {"holderIdentity": ""}
        }))
        .unwrap();
        assert_eq!(CachedLease::from_lease(released).holder, None);
    }
}
