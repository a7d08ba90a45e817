//! Pods as the operator caches them.

use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;

use crate::state::cache::Keyed;
use fenced_lease_api::TOKEN_ANNOTATION_PREFIX;

/// What the operator keeps of a pod: its name, UID and version, and its token annotations.
/// Pods are most of the objects it watches, so nothing else is kept, and the annotations as
/// a short list, not a map.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachedPod {
    pub name: String,
    pub namespace: String,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    /// `(lease, token)` of each `token.fencing.dev/<lease>` annotation.
    pub tokens: Vec<(String, String)>,
}

impl CachedPod {
    pub fn from_meta(pod: PartialObjectMeta<Pod>) -> Self {
        let meta = pod.metadata;
        let tokens = meta
            .annotations
            .into_iter()
            .flatten()
            .filter_map(|(key, value)| {
                let lease = key
                    .strip_prefix(TOKEN_ANNOTATION_PREFIX)?
                    .strip_prefix('/')?;
                Some((lease.to_owned(), value))
            })
            .collect();
        Self {
            name: meta.name.unwrap_or_default(),
            namespace: meta.namespace.unwrap_or_default(),
            uid: meta.uid,
            resource_version: meta.resource_version,
            tokens,
        }
    }

    /// Its token annotation of lease `lease`, if any.
    pub fn token(&self, lease: &str) -> Option<&str> {
        self.tokens
            .iter()
            .find(|(l, _)| l == lease)
            .map(|(_, token)| token.as_str())
    }

    /// The leases whose token annotation it carries.
    pub fn leases(&self) -> Vec<String> {
        self.tokens.iter().map(|(lease, _)| lease.clone()).collect()
    }
}

impl Keyed for CachedPod {
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
    fn a_cached_pod_keeps_its_identity_and_token_annotations_only() {
        let pod: PartialObjectMeta<Pod> = serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "web-0", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
                "labels": {"app": "web"},
                "annotations": {
                    "token.fencing.dev/db": "12",
                    "token.fencing.dev.example/x": "another tool's",
                    "token.fencing.dev": "no lease",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}"
                }
            }
        }))
        .unwrap();
        let cached = CachedPod::from_meta(pod);
        assert_eq!(
            cached,
            CachedPod {
                name: "web-0".into(),
                namespace: "ns".into(),
                uid: Some("u-1".into()),
                resource_version: Some("7".into()),
                tokens: vec![("db".into(), "12".into())],
            }
        );
        assert_eq!(cached.token("db"), Some("12"));
        assert_eq!(cached.token("x"), None);
        assert_eq!(
            (Keyed::namespace(&cached), Keyed::name(&cached)),
            ("ns", "web-0")
        );
    }
}
