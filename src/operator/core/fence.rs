//! The lease rules of the object fence. For each FencedLease the operator keeps up to two
//! ValidatingAdmissionPolicyBindings of the lease rules (`deploy/admission/fence-policy.yaml`),
//! each with the lease itself as params (`paramRef.name`, `parameterNotFoundAction: Allow`: a
//! lease that is gone fences nothing):
//! - `fenced-lease.<ns>.<lease>`, while `spec.fenceObjects` is on: the objects of the lease's
//!   namespace labelled `fencing.dev/lease=<lease>`, through the shared policy
//!   [`LEASE_POLICY`], which matches labelled objects only;
//! - `fenced-lease-kinds.<ns>.<lease>`, while `spec.fence` is set: the objects of the kinds it
//!   names in the lease's namespace, every subresource included, through a policy of the
//!   lease's own of the same name ([`super::fence_policy`]), which matches only those objects
//!   (its selector is the policy's match condition).
//!
//! A policy matches no more than what it fences because the apiserver refuses *every* write
//! a policy matches while it cannot resolve the policy's params kind (for up to 30 s after it
//! starts, before it has discovered the FencedLease CRD; kubernetes/kubernetes#124237): a
//! policy matching every namespaced object would stop the cluster's writes meanwhile (node
//! leases, leader elections, Events), not only the fenced ones.
//!
//! The apiserver then refuses a write to such an object by a pod that is not the lease's
//! holder, or whose token is below the lease's `status.fencingToken`.
//!
//! A binding is cluster-scoped and cannot be owned by a namespaced lease, so nothing garbage
//! collects it: the operator deletes it when its field is turned off, when the lease is
//! deleted (before its finalizer goes), on the lease's delete event (its finalizer stripped),
//! and, after every (re)list of its bindings and every five minutes, any whose lease the API
//! says is gone. Every step is idempotent and safe if
//! the one before never ran. The operator's bindings are labelled, and watched into a cache,
//! so that an unchanged lease costs no API call.

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, ParamRef, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::ObjectMeta;
use std::collections::BTreeMap;
use std::time::Duration;

use crate::api::{FenceSpec, FencedLease, LEASE_LABEL};
use crate::fence::kube::LEASE_POLICY;

/// Label naming who manages a binding, and the value the operator sets.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "fenced-lease-operator");
/// Labels naming the lease a binding is for.
pub const LEASE_NAMESPACE_LABEL: &str = "fencing.dev/lease-namespace";
pub const LEASE_NAME_LABEL: &str = "fencing.dev/lease-name";
/// How often bindings are checked for a lease that is gone, besides after every (re)list.
pub const ORPHAN_SWEEP: Duration = Duration::from_secs(300);
/// How long after creating or restoring a binding its lease waits before it is decided
/// (granted) again: the apiserver enforces a binding only once its informers deliver it, and
/// the first holder's term must be fenced from its start.
pub const BINDING_SETTLE: Duration = Duration::from_secs(2);

/// Name of the binding of lease `ns/name` for its labelled objects. Namespace names have no
/// dots, so the name is unambiguous; it stays under 253 characters (lease names are at most 63).
pub fn binding_name(ns: &str, name: &str) -> String {
    format!("fenced-lease.{ns}.{name}")
}

/// Name of the binding of lease `ns/name` for the kinds it names in `spec.fence`.
pub fn kinds_binding_name(ns: &str, name: &str) -> String {
    format!("fenced-lease-kinds.{ns}.{name}")
}

/// The binding that applies the lease rules of lease `ns/name` to the objects labelled with it.
pub fn desired_binding(ns: &str, name: &str) -> ValidatingAdmissionPolicyBinding {
    binding(
        binding_name(ns, name),
        ns,
        name,
        MatchResources {
            namespace_selector: Some(selector("kubernetes.io/metadata.name", ns)),
            object_selector: Some(selector(LEASE_LABEL, name)),
            ..Default::default()
        },
    )
}

/// The binding that applies the lease rules of lease `ns/name` to the objects of the kinds
/// `fence` names, in the lease's namespace, with all their subresources, through the lease's
/// own policy ([`desired_kinds_policy`](super::fence_policy::desired_kinds_policy), of the
/// same name and the same match).
pub fn desired_kinds_binding(
    ns: &str,
    name: &str,
    fence: &FenceSpec,
) -> ValidatingAdmissionPolicyBinding {
    let policy = kinds_binding_name(ns, name);
    let mut binding = binding(policy.clone(), ns, name, kinds_match(ns, fence));
    binding.spec.policy_name = policy;
    binding
}

/// What the kinds binding and policy of a lease in `ns` with `fence` match: the kinds it names
/// with all their subresources, in `ns`, of its selector.
pub fn kinds_match(ns: &str, fence: &FenceSpec) -> MatchResources {
    let rules = fence
        .resources
        .iter()
        .map(|r| NamedRuleWithOperations {
            api_groups: Some(vec![r.group.clone()]),
            api_versions: Some(vec!["*".into()]),
            operations: Some(["CREATE", "UPDATE", "DELETE"].map(String::from).to_vec()),
            resources: Some(vec![r.resource.clone(), format!("{}/*", r.resource)]),
            scope: Some("Namespaced".into()),
            resource_names: None,
        })
        .collect();
    MatchResources {
        namespace_selector: Some(selector("kubernetes.io/metadata.name", ns)),
        // The selector is the policy's match condition: as an objectSelector it would never
        // match a scale, which carries no labels.
        object_selector: None,
        resource_rules: Some(rules),
        ..Default::default()
    }
}

/// The labels of the operator's fence objects (bindings, policies) of lease `ns/name`.
pub fn labels(ns: &str, name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
        (LEASE_NAMESPACE_LABEL.to_string(), ns.to_string()),
        (LEASE_NAME_LABEL.to_string(), name.to_string()),
    ])
}

fn binding(
    binding_name: String,
    ns: &str,
    name: &str,
    match_resources: MatchResources,
) -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: ObjectMeta {
            name: Some(binding_name),
            labels: Some(labels(ns, name)),
            ..Default::default()
        },
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: LEASE_POLICY.into(),
            validation_actions: vec!["Deny".into()],
            param_ref: Some(ParamRef {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                // A lease that is gone fences nothing: a binding it left behind (its
                // finalizer stripped) refuses no one. While the apiserver cannot yet read
                // FencedLeases at all, the policy fails closed (`failurePolicy: Fail`).
                parameter_not_found_action: Some("Allow".into()),
                selector: None,
            }),
            match_resources: Some(match_resources),
        },
    }
}

/// A binding lease `ns/name` may have.
#[derive(Debug)]
pub struct Wanted {
    /// The binding's name, and its own policy's when it has one.
    pub name: String,
    /// The binding to keep; `None`: delete it.
    pub binding: Option<ValidatingAdmissionPolicyBinding>,
    /// Whether the spec asks for it. A binding not asked for is deleted only when the cache
    /// shows it; one of a lease being deleted is always asked for.
    pub asked: bool,
    /// Whether it uses a policy of its own of the same name, kept and deleted with it.
    pub own_policy: bool,
}

pub fn desired_bindings(ns: &str, name: &str, lease: &FencedLease) -> [Wanted; 2] {
    let live = lease.metadata.deletion_timestamp.is_none();
    let spec = &lease.spec;
    [
        Wanted {
            name: binding_name(ns, name),
            binding: (spec.fence_objects && live).then(|| desired_binding(ns, name)),
            asked: spec.fence_objects,
            own_policy: false,
        },
        Wanted {
            name: kinds_binding_name(ns, name),
            binding: spec
                .fence
                .as_ref()
                .filter(|_| live)
                .map(|fence| desired_kinds_binding(ns, name, fence)),
            asked: spec.fence.is_some(),
            own_policy: true,
        },
    ]
}

fn selector(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
        match_expressions: None,
    }
}

/// The part of a binding's or policy's match that decides what it matches, without the
/// defaults the apiserver adds (`matchPolicy`, empty selectors and lists, a rule's scope).
pub fn matching(m: &Option<MatchResources>) -> MatchResources {
    let m = m.clone().unwrap_or_default();
    let selector = |s: Option<LabelSelector>| s.filter(|s| *s != LabelSelector::default());
    // A rule's scope defaults to "*".
    let rules = |r: Option<Vec<NamedRuleWithOperations>>| {
        let scoped = |r: NamedRuleWithOperations| NamedRuleWithOperations {
            scope: r.scope.or_else(|| Some("*".into())),
            ..r
        };
        non_empty(&r).map(|r| r.into_iter().map(scoped).collect::<Vec<_>>())
    };
    MatchResources {
        match_policy: None,
        namespace_selector: selector(m.namespace_selector),
        object_selector: selector(m.object_selector),
        resource_rules: rules(m.resource_rules),
        exclude_resource_rules: rules(m.exclude_resource_rules),
    }
}

/// A list, or none when empty (the apiserver may store either).
pub fn non_empty<T: Clone>(list: &Option<Vec<T>>) -> Option<Vec<T>> {
    list.clone().filter(|l| !l.is_empty())
}

/// Does `existing` say what `desired` says? (The apiserver adds defaults; they are ignored.)
pub fn is_current(
    existing: &ValidatingAdmissionPolicyBinding,
    desired: &ValidatingAdmissionPolicyBinding,
) -> bool {
    let (have, want) = (&existing.spec, &desired.spec);
    have.policy_name == want.policy_name
        && have.validation_actions == want.validation_actions
        && have.param_ref == want.param_ref
        && matching(&have.match_resources) == matching(&want.match_resources)
        && existing.labels() == desired.labels()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_names_the_lease_as_params_and_selects_its_objects() {
        let b = desired_binding("team-a", "db.migrate");
        assert_eq!(b.name_any(), "fenced-lease.team-a.db.migrate");
        let spec = &b.spec;
        let param = spec.param_ref.as_ref().unwrap();
        assert_eq!(
            (param.name.as_deref(), param.namespace.as_deref()),
            (Some("db.migrate"), Some("team-a"))
        );
        assert_eq!(param.parameter_not_found_action.as_deref(), Some("Allow"));
        let objects = spec
            .match_resources
            .as_ref()
            .unwrap()
            .object_selector
            .clone();
        assert_eq!(
            objects.unwrap().match_labels.unwrap()[LEASE_LABEL],
            "db.migrate"
        );
    }

    #[test]
    fn kinds_binding_matches_each_kind_with_its_subresources_in_the_lease_namespace() {
        let fence: FenceSpec = serde_json::from_value(serde_json::json!({
            "resources": [{"group": "apps", "resource": "deployments"}, {"resource": "configmaps"}],
            "selector": {"matchLabels": {"app": "books"}},
        }))
        .unwrap();
        let b = desired_kinds_binding("team-a", "books", &fence);
        assert_eq!(b.name_any(), "fenced-lease-kinds.team-a.books");
        assert_ne!(b.name_any(), desired_binding("team-a", "books").name_any());
        let m = b.spec.match_resources.as_ref().unwrap();
        let rules: Vec<_> = m
            .resource_rules
            .iter()
            .flatten()
            .map(|r| (r.api_groups.clone().unwrap(), r.resources.clone().unwrap()))
            .collect();
        assert_eq!(
            rules,
            [
                (
                    vec!["apps".to_string()],
                    vec!["deployments".to_string(), "deployments/*".to_string()]
                ),
                (
                    vec!["".to_string()],
                    vec!["configmaps".to_string(), "configmaps/*".to_string()]
                ),
            ]
        );
        assert_eq!(
            m.object_selector, None,
            "the selector is the policy's condition"
        );
        assert_eq!(
            m.namespace_selector.clone().unwrap().match_labels.unwrap()["kubernetes.io/metadata.name"],
            "team-a"
        );
    }

    #[test]
    fn a_lease_wants_a_binding_per_way_it_fences_and_none_while_deleted() {
        let mut lease = FencedLease::new(
            "books",
            serde_json::from_value(serde_json::json!({
                "fenceObjects": true,
                "fence": {"resources": [{"resource": "configmaps"}]},
            }))
            .unwrap(),
        );
        let wanted = |lease: &FencedLease| {
            desired_bindings("ns", "books", lease).map(|w| (w.name, w.binding.is_some(), w.asked))
        };
        assert_eq!(
            wanted(&lease),
            [
                ("fenced-lease.ns.books".to_string(), true, true),
                ("fenced-lease-kinds.ns.books".to_string(), true, true),
            ]
        );
        lease.spec.fence_objects = false;
        lease.spec.fence = None;
        assert_eq!(
            wanted(&lease).map(|(_, desired, asked)| (desired, asked)),
            [(false, false), (false, false)]
        );
        lease.spec.fence_objects = true;
        lease.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert_eq!(
            wanted(&lease).map(|(_, desired, asked)| (desired, asked)),
            [(false, true), (false, false)]
        );
    }

    #[test]
    fn defaults_added_by_the_apiserver_do_not_count_as_a_change() {
        let desired = desired_binding("ns", "l");
        let mut stored = desired.clone();
        let m = stored.spec.match_resources.as_mut().unwrap();
        m.match_policy = Some("Equivalent".into());
        assert!(is_current(&stored, &desired));
        stored.spec.param_ref.as_mut().unwrap().name = Some("other".into());
        assert!(!is_current(&stored, &desired));

        let fence: FenceSpec =
            serde_json::from_value(serde_json::json!({"resources": [{"resource": "configmaps"}]}))
                .unwrap();
        let desired = desired_kinds_binding("ns", "l", &fence);
        let mut stored = desired.clone();
        let m = stored.spec.match_resources.as_mut().unwrap();
        m.match_policy = Some("Equivalent".into());
        m.object_selector = Some(LabelSelector::default());
        m.exclude_resource_rules = Some(vec![]);
        assert!(is_current(&stored, &desired), "defaults only");
        let m = stored.spec.match_resources.as_mut().unwrap();
        m.resource_rules.as_mut().unwrap()[0].resources = Some(vec!["configmaps".into()]);
        assert!(
            !is_current(&stored, &desired),
            "a subresource rule dropped by hand"
        );
    }
}
