//! The admission objects as shipped (`deploy/admission/`, the chart installs them verbatim):
//! their names, the lease rules every FencedLease-bound policy carries, and the kinds slots
//! (`deploy/admission/fence-kinds.yaml`, generated from here by `make crds`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, ParamRef, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::ObjectMeta;

pub use fenced_lease::fence::kube::{LEASE_POLICY, OBJECT_POLICY};
use fenced_lease_api::FencedResource;

/// The binding of [`LEASE_POLICY`] for labelled objects: every lease of the object's namespace
/// as params.
pub const OBJECTS_BINDING: &str = "fenced-lease-objects";
/// How many kinds `spec.fence` may name across the cluster: one kinds slot (a policy and its
/// binding) each.
pub const SLOTS: usize = 16;
/// The file the kinds slots are shipped in, under `deploy/admission/`.
pub const SLOTS_FILE: &str = "fence-kinds.yaml";
/// Labels of every admission object shipped (the operator watches those).
pub const LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/name", "fenced-lease"),
    ("app.kubernetes.io/component", "admission"),
];
/// The label key a namespace selector matches names by (the apiserver sets it on every namespace).
const NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";
/// What an unused slot matches: a resource that does not exist, of a group every policy excludes.
const UNUSED: &str = "unused-slot";

/// The policies the operator was built with.
const POLICIES: &str = include_str!("../../../../deploy/admission/fence-policy.yaml");

/// The spec of [`LEASE_POLICY`] as shipped, or why it cannot be read (a build defect).
static TEMPLATE: LazyLock<Result<ValidatingAdmissionPolicySpec, String>> =
    LazyLock::new(|| template(POLICIES));

fn template(yaml: &str) -> Result<ValidatingAdmissionPolicySpec, String> {
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(yaml).map_err(|e| e.to_string())?;
    let policy = documents
        .into_iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .find(|d| d["metadata"]["name"] == LEASE_POLICY)
        .ok_or_else(|| format!("no ValidatingAdmissionPolicy {LEASE_POLICY}"))?;
    let policy: ValidatingAdmissionPolicy =
        serde_json::from_value(policy).map_err(|e| e.to_string())?;
    policy
        .spec
        .ok_or_else(|| format!("{LEASE_POLICY} has no spec"))
}

/// [`LEASE_POLICY`]'s spec as this operator was built with it.
pub fn lease_rules() -> Result<&'static ValidatingAdmissionPolicySpec, String> {
    TEMPLATE
        .as_ref()
        .map_err(|e| format!("the lease rules built into the operator cannot be read: {e}"))
}

/// Name of kinds slot `i` (its policy and its binding).
pub fn slot_name(i: usize) -> String {
    format!("fenced-lease-kinds-{i:02}")
}

/// Every slot's name, in order.
pub fn slot_names() -> Vec<String> {
    (0..SLOTS).map(slot_name).collect()
}

/// What a kinds slot fences: one kind, in some namespaces.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    pub kind: FencedResource,
    pub namespaces: BTreeSet<String>,
}

/// Slot `i`'s policy: the lease rules, matching `assigned`'s kind (every subresource) in its
/// namespaces, or nothing when unused.
pub fn slot_policy(
    i: usize,
    assigned: Option<&Assignment>,
) -> Result<ValidatingAdmissionPolicy, String> {
    let mut spec = lease_rules()?.clone();
    let shipped = spec.match_constraints.take().unwrap_or_default();
    let matched = match assigned {
        Some(a) => MatchResources {
            namespace_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: NAMESPACE_NAME.into(),
                    operator: "In".into(),
                    values: Some(a.namespaces.iter().cloned().collect()),
                }]),
                match_labels: None,
            }),
            resource_rules: Some(vec![rule(&a.kind.group, &a.kind.resource, true)]),
            ..Default::default()
        },
        None => MatchResources {
            resource_rules: Some(vec![rule("fencing.dev", UNUSED, false)]),
            ..Default::default()
        },
    };
    spec.match_constraints = Some(MatchResources {
        // The shipped policy's exclusions (the project's own kinds) still hold.
        exclude_resource_rules: shipped.exclude_resource_rules,
        ..matched
    });
    Ok(ValidatingAdmissionPolicy {
        metadata: metadata(slot_name(i)),
        spec: Some(spec),
        status: None,
    })
}

/// Slot `i`'s binding: its policy, with every lease of the written object's namespace as params.
pub fn slot_binding(i: usize) -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: metadata(slot_name(i)),
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: slot_name(i),
            validation_actions: vec!["Deny".into(), "Audit".into()],
            param_ref: Some(every_lease()),
            match_resources: None,
        },
    }
}

/// Params: every FencedLease of the request's namespace; none there (or the lease gone)
/// fences nothing.
fn every_lease() -> ParamRef {
    ParamRef {
        selector: Some(LabelSelector::default()),
        parameter_not_found_action: Some("Allow".into()),
        name: None,
        namespace: None,
    }
}

fn rule(group: &str, resource: &str, subresources: bool) -> NamedRuleWithOperations {
    let mut resources = vec![resource.to_string()];
    if subresources {
        resources.push(format!("{resource}/*"));
    }
    NamedRuleWithOperations {
        api_groups: Some(vec![group.to_string()]),
        api_versions: Some(vec!["*".into()]),
        operations: Some(["CREATE", "UPDATE", "DELETE"].map(String::from).to_vec()),
        resources: Some(resources),
        scope: Some("Namespaced".into()),
        resource_names: None,
    }
}

fn metadata(name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        labels: Some(
            LABELS
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    }
}

/// A policy's match that is not a kinds slot's (edited by hand): it is written again.
#[derive(Debug, PartialEq, Eq)]
pub struct NotASlot;

/// What slot policy `policy` fences, as stored: `Ok(None)` unused.
pub fn assignment(policy: &ValidatingAdmissionPolicy) -> Result<Option<Assignment>, NotASlot> {
    let m = policy
        .spec
        .as_ref()
        .and_then(|s| s.match_constraints.clone())
        .ok_or(NotASlot)?;
    let [rule] = m.resource_rules.as_deref().unwrap_or_default() else {
        return Err(NotASlot);
    };
    let group = rule
        .api_groups
        .as_deref()
        .and_then(|g| g.first())
        .ok_or(NotASlot)?;
    let resource = rule
        .resources
        .as_deref()
        .and_then(|r| r.first())
        .ok_or(NotASlot)?;
    if group == "fencing.dev" {
        return (resource == UNUSED).then_some(None).ok_or(NotASlot);
    }
    let expressions = m
        .namespace_selector
        .and_then(|s| s.match_expressions)
        .unwrap_or_default();
    let [e] = expressions.as_slice() else {
        return Err(NotASlot);
    };
    if e.key != NAMESPACE_NAME || e.operator != "In" {
        return Err(NotASlot);
    }
    Ok(Some(Assignment {
        kind: FencedResource {
            group: group.clone(),
            resource: resource.clone(),
        },
        namespaces: e.values.iter().flatten().cloned().collect(),
    }))
}

/// Does `existing` say what `desired` says? (The apiserver adds defaults; they are ignored.)
pub fn policy_is_current(
    existing: &ValidatingAdmissionPolicy,
    desired: &ValidatingAdmissionPolicy,
) -> bool {
    let (Some(have), Some(want)) = (&existing.spec, &desired.spec) else {
        return false;
    };
    let failure =
        |s: &ValidatingAdmissionPolicySpec| s.failure_policy.clone().unwrap_or("Fail".into());
    have.param_kind == want.param_kind
        && failure(have) == failure(want)
        && have.validations == want.validations
        && have.variables == want.variables
        && non_empty(&have.match_conditions) == non_empty(&want.match_conditions)
        && non_empty(&have.audit_annotations) == non_empty(&want.audit_annotations)
        && matching(&have.match_constraints) == matching(&want.match_constraints)
}

/// Does binding `b` bind `policy` as shipped: denying, every lease of the namespace as params,
/// nothing narrowed?
pub fn binding_is_intact(b: &ValidatingAdmissionPolicyBinding, policy: &str) -> bool {
    let spec = &b.spec;
    spec.policy_name == policy
        && spec.validation_actions.iter().any(|a| a == "Deny")
        && spec.param_ref.as_ref().is_some_and(|p| {
            p.name.is_none()
                && p.namespace.is_none()
                && p.selector.as_ref().is_some_and(|s| {
                    non_empty(&s.match_expressions).is_none()
                        && s.match_labels.as_ref().is_none_or(|l| l.is_empty())
                })
                && p.parameter_not_found_action.as_deref() == Some("Allow")
        })
        && matching(&spec.match_resources) == MatchResources::default()
}

/// The part of a match that decides what it matches, without the defaults the apiserver adds
/// (`matchPolicy`, empty selectors and lists, a rule's scope).
fn matching(m: &Option<MatchResources>) -> MatchResources {
    let m = m.clone().unwrap_or_default();
    let selector = |s: Option<LabelSelector>| s.filter(|s| *s != LabelSelector::default());
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
fn non_empty<T: Clone>(list: &Option<Vec<T>>) -> Option<Vec<T>> {
    list.clone().filter(|l| !l.is_empty())
}

/// `deploy/admission/fence-kinds.yaml`: every slot, unused.
pub fn slots_yaml() -> Result<String, String> {
    let mut out = String::from(SLOTS_HEADER);
    for i in 0..SLOTS {
        let policy = slot_policy(i, None)?;
        for document in [
            serde_saphyr::to_string(&policy),
            serde_saphyr::to_string(&slot_binding(i)),
        ] {
            out.push_str("---\n");
            out.push_str(&document.map_err(|e| e.to_string())?);
        }
    }
    Ok(out)
}

const SLOTS_HEADER: &str = "\
# Generated by `make crds` (crates/operator/src/admission/shipped.rs): do not edit.
#
# The kinds slots: the lease rules of fence-policy.yaml (fenced-lease-lease-token), once per
# kind that a FencedLease's spec.fence names, anywhere in the cluster. The operator keeps each
# slot's match: one kind (every subresource) in the namespaces whose leases fence it; an
# unused slot matches nothing. Each binding asks every FencedLease of the written object's
# namespace; only a lease that fences the object applies. So the apiserver's work per write
# does not grow with the number of leases in the cluster, and the operator only updates these
# objects (RBAC: `update` of these names; it creates and deletes no admission object).
# A policy matches only what a lease fences: while the apiserver cannot resolve its params
# kind (after it starts, until it has discovered the FencedLease CRD), it refuses every write
# it matches.
";

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;

    fn kind(group: &str, resource: &str) -> FencedResource {
        FencedResource {
            group: group.into(),
            resource: resource.into(),
        }
    }

    /// The match of `policy`, to edit.
    fn match_of(policy: &mut ValidatingAdmissionPolicy) -> &mut MatchResources {
        policy
            .spec
            .as_mut()
            .unwrap()
            .match_constraints
            .as_mut()
            .unwrap()
    }

    #[test]
    fn a_slot_is_the_lease_rules_matching_its_kind_in_its_namespaces_only() {
        let a = Assignment {
            kind: kind("apps", "deployments"),
            namespaces: ["b", "a"].map(String::from).into(),
        };
        let policy = slot_policy(3, Some(&a)).unwrap();
        assert_eq!(policy.name_any(), "fenced-lease-kinds-03");
        let spec = policy.spec.as_ref().unwrap();
        let shipped = lease_rules().unwrap();
        assert_eq!(spec.validations, shipped.validations);
        assert_eq!(spec.variables, shipped.variables);
        assert_eq!(spec.param_kind, shipped.param_kind);
        let m = spec.match_constraints.as_ref().unwrap();
        let rule = &m.resource_rules.as_ref().unwrap()[0];
        assert_eq!(
            rule.resources.as_deref().unwrap(),
            ["deployments", "deployments/*"]
        );
        let e = &m
            .namespace_selector
            .as_ref()
            .unwrap()
            .match_expressions
            .as_ref()
            .unwrap()[0];
        assert_eq!(e.values.as_deref().unwrap(), ["a", "b"]);
        assert!(m.object_selector.is_none(), "a scale carries no labels");
        assert_eq!(assignment(&policy), Ok(Some(a)));
        let unused = slot_policy(3, None).unwrap();
        assert_eq!(assignment(&unused), Ok(None));
        assert!(!policy_is_current(&unused, &policy));
    }

    #[test]
    fn a_slot_edited_by_hand_is_not_current_and_defaults_do_not_count() {
        let a = Assignment {
            kind: kind("", "configmaps"),
            namespaces: ["a".to_string()].into(),
        };
        let desired = slot_policy(0, Some(&a)).unwrap();
        let mut stored = desired.clone();
        let spec = stored.spec.as_mut().unwrap();
        spec.failure_policy = None;
        let m = spec.match_constraints.as_mut().unwrap();
        m.match_policy = Some("Equivalent".into());
        m.object_selector = Some(LabelSelector::default());
        assert!(policy_is_current(&stored, &desired), "defaults only");
        match_of(&mut stored).resource_rules.as_mut().unwrap()[0].resources =
            Some(vec!["*".into()]);
        assert!(!policy_is_current(&stored, &desired), "widened by hand");
        let mut stored = desired.clone();
        let validations = stored.spec.as_mut().unwrap().validations.as_mut();
        validations.unwrap().pop();
        assert!(!policy_is_current(&stored, &desired), "a rule dropped");
        let mut stored = desired.clone();
        let rules = match_of(&mut stored).resource_rules.as_mut().unwrap();
        rules.push(rule("", "secrets", true));
        assert_eq!(assignment(&stored), Err(NotASlot), "not a slot's match");
    }

    #[test]
    fn a_binding_is_intact_only_as_shipped() {
        let b = slot_binding(1);
        assert!(binding_is_intact(&b, "fenced-lease-kinds-01"));
        assert!(!binding_is_intact(&b, "fenced-lease-kinds-02"));
        let mut warn = b.clone();
        warn.spec.validation_actions = vec!["Warn".into()];
        assert!(!binding_is_intact(&warn, "fenced-lease-kinds-01"));
        let mut named = b.clone();
        named.spec.param_ref.as_mut().unwrap().name = Some("x".into());
        assert!(!binding_is_intact(&named, "fenced-lease-kinds-01"));
        let mut deny_missing = b.clone();
        deny_missing
            .spec
            .param_ref
            .as_mut()
            .unwrap()
            .parameter_not_found_action = Some("Deny".into());
        assert!(!binding_is_intact(&deny_missing, "fenced-lease-kinds-01"));
    }

    #[test]
    fn the_shipped_slots_are_what_the_operator_generates() {
        let shipped = include_str!("../../../../deploy/admission/fence-kinds.yaml");
        assert!(
            shipped == slots_yaml().unwrap(),
            "deploy/admission/{SLOTS_FILE} is out of date: run `make crds`"
        );
    }

    #[test]
    fn the_shipped_objects_binding_asks_every_lease_of_the_namespace() {
        let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(POLICIES).unwrap();
        let binding = documents
            .into_iter()
            .find(|d| d["metadata"]["name"] == OBJECTS_BINDING)
            .unwrap();
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(binding).unwrap();
        assert!(binding_is_intact(&binding, LEASE_POLICY));
    }

    #[test]
    fn a_template_without_the_lease_rules_is_an_error_not_a_panic() {
        assert!(template("kind: ConfigMap\n").is_err());
        assert!(template(": not yaml [").is_err());
    }
}
