//! The policy of a lease's kinds binding: a copy of the lease rules ([`LEASE_POLICY`], read from
//! `deploy/admission/fence-policy.yaml` as built into the operator) whose `matchConstraints`
//! are the binding's own match: the kinds the lease names in `spec.fence`, with their
//! subresources, in its namespace, of its selector.
//!
//! Why a policy per lease, not one shared policy: while the apiserver cannot resolve a
//! policy's params kind (after it starts, until it has discovered the FencedLease CRD, up to
//! 30 s; or for good while the CRD is missing) it refuses every write the *policy* matches,
//! whatever its bindings say (`failurePolicy: Fail`). Kinds fenced without a label can only be
//! matched by kind, and a shared policy would have to match every namespaced kind: each start
//! of an apiserver would then refuse the whole cluster's writes, node leases and leader
//! elections included. A policy per lease refuses only the kinds its lease fences, in its
//! namespace, which are refused anyway when in doubt. With a selector, that is every object of
//! those kinds there: the selector is a match condition, which the apiserver does not reach
//! while it cannot resolve the params kind (an `objectSelector` could not match a `scale`).

use std::sync::LazyLock;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, ValidatingAdmissionPolicy, ValidatingAdmissionPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::ObjectMeta;

use super::fence::{kinds_binding_name, kinds_match, labels, matching, non_empty};
use crate::api::FenceSpec;
use crate::fence::kube::LEASE_POLICY;

/// The policies the operator ships, as built into it.
const POLICIES: &str = include_str!("../../../deploy/admission/fence-policy.yaml");

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

/// The policy of the kinds binding of lease `ns/name`, which fences the kinds `fence` names.
pub fn desired_kinds_policy(
    ns: &str,
    name: &str,
    fence: &FenceSpec,
) -> Result<ValidatingAdmissionPolicy, String> {
    let template = TEMPLATE
        .as_ref()
        .map_err(|e| format!("the lease rules built into the operator cannot be read: {e}"))?;
    let mut spec = template.clone();
    let shipped = spec.match_constraints.take().unwrap_or_default();
    spec.match_constraints = Some(
        k8s_openapi::api::admissionregistration::v1::MatchResources {
            // The shipped policy's exclusions (the project's own kinds) still hold.
            exclude_resource_rules: shipped.exclude_resource_rules,
            ..kinds_match(ns, fence)
        },
    );
    spec.match_conditions = fence.selector.as_ref().map(|selector| {
        vec![MatchCondition {
            name: "selected".into(),
            expression: selected(selector),
        }]
    });
    Ok(ValidatingAdmissionPolicy {
        metadata: ObjectMeta {
            name: Some(kinds_binding_name(ns, name)),
            labels: Some(labels(ns, name)),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// The CEL condition of a kinds policy with a selector: the object written (or the one it
/// replaces or deletes) has labels that match, as a binding's `objectSelector` would match
/// them; or the write is to a subresource other than `status`, whose request carries no labels
/// of the object (`scale`, `eviction`): those are fenced for every object of the kind, since
/// the apiserver cannot tell which object's labels they concern. (A request to no subresource
/// has no `subResource` at all.)
pub fn selected(selector: &LabelSelector) -> String {
    let mut rules: Vec<String> = Vec::new();
    for (key, value) in selector.match_labels.iter().flatten() {
        let (has, label) = (has_label(key), label(key));
        rules.push(format!("({has} && {label} == {})", cel_string(value)));
    }
    for e in selector.match_expressions.iter().flatten() {
        let values: Vec<String> = e.values.iter().flatten().map(|v| cel_string(v)).collect();
        let values = format!("[{}]", values.join(", "));
        let (has, label) = (has_label(&e.key), label(&e.key));
        rules.push(match e.operator.as_str() {
            "In" => format!("({has} && {label} in {values})"),
            "NotIn" => format!("!({has} && {label} in {values})"),
            "Exists" => has,
            "DoesNotExist" => format!("!{has}"),
            // The schema admits no other operator; one that got past it selects nothing.
            _ => "false".into(),
        });
    }
    let matches = if rules.is_empty() {
        "true".to_string()
    } else {
        rules.join(" && ")
    };
    format!(
        "(has(request.subResource) && !(request.subResource in ['', 'status'])) || [object, oldObject].exists(o, o != null && {matches})"
    )
}

/// Object `o` carries label `key`.
fn has_label(key: &str) -> String {
    format!(
        "(has(o.metadata.labels) && {} in o.metadata.labels)",
        cel_string(key)
    )
}

/// The value of object `o`'s label `key` (when [`has_label`]).
fn label(key: &str) -> String {
    format!("o.metadata.labels[{}]", cel_string(key))
}

/// `text` as a CEL string literal.
fn cel_string(text: &str) -> String {
    let escaped: String = text
        .chars()
        .flat_map(|c| match c {
            '\\' => vec!['\\', '\\'],
            '\'' => vec!['\\', '\''],
            '\n' => vec!['\\', 'n'],
            c => vec![c],
        })
        .collect();
    format!("'{escaped}'")
}

/// Does `existing` say what `desired` says? (The apiserver adds defaults; they are ignored.)
pub fn is_current(
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
        && existing.labels() == desired.labels()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::core::fence::desired_kinds_binding;

    fn fence() -> FenceSpec {
        serde_json::from_value(serde_json::json!({
            "resources": [{"group": "apps", "resource": "deployments"}],
            "selector": {"matchLabels": {"app": "books"}},
        }))
        .unwrap()
    }

    #[test]
    fn the_kinds_policy_is_the_lease_rules_matching_only_what_its_binding_matches() {
        let policy = desired_kinds_policy("team-a", "books", &fence()).unwrap();
        let binding = desired_kinds_binding("team-a", "books", &fence());
        assert_eq!(policy.name_any(), "fenced-lease-kinds.team-a.books");
        assert_eq!(binding.spec.policy_name, policy.name_any());
        let spec = policy.spec.as_ref().unwrap();
        let shipped = TEMPLATE.as_ref().unwrap();
        assert_eq!(spec.validations, shipped.validations);
        assert_eq!(spec.variables, shipped.variables);
        assert_eq!(
            spec.param_kind.as_ref().unwrap().kind.as_deref(),
            Some("FencedLease")
        );
        assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
        let constraints = spec.match_constraints.clone().unwrap();
        let mut bound = binding.spec.match_resources.clone().unwrap();
        bound.exclude_resource_rules = constraints.exclude_resource_rules.clone();
        assert_eq!(constraints, bound, "the binding's match, nothing wider");
        let excluded = constraints.exclude_resource_rules.unwrap();
        assert_eq!(
            excluded[0].api_groups.as_deref(),
            Some(&["fencing.dev".to_string()][..])
        );
    }

    #[test]
    fn the_shared_lease_rules_match_labelled_objects_only() {
        let shipped = TEMPLATE.as_ref().unwrap();
        let selector = shipped
            .match_constraints
            .as_ref()
            .and_then(|m| m.object_selector.clone())
            .and_then(|s| s.match_expressions)
            .unwrap_or_default();
        assert!(
            selector
                .iter()
                .any(|e| e.key == crate::api::LEASE_LABEL && e.operator == "Exists"),
            "{LEASE_POLICY} must match only objects labelled {}: {selector:?}",
            crate::api::LEASE_LABEL
        );
    }

    #[test]
    fn a_policy_is_current_despite_defaults_and_not_after_an_edit() {
        let desired = desired_kinds_policy("ns", "l", &fence()).unwrap();
        let mut stored = desired.clone();
        let spec = stored.spec.as_mut().unwrap();
        spec.failure_policy = None;
        let constraints = spec.match_constraints.as_mut().unwrap();
        constraints.match_policy = Some("Equivalent".into());
        constraints.exclude_resource_rules.as_mut().unwrap()[0].scope = Some("*".into());
        assert!(is_current(&stored, &desired), "defaults only");
        let rules = stored
            .spec
            .as_mut()
            .unwrap()
            .match_constraints
            .as_mut()
            .unwrap();
        rules.resource_rules.as_mut().unwrap()[0].resources = Some(vec!["*".into()]);
        assert!(!is_current(&stored, &desired), "widened by hand");
        let mut stored = desired.clone();
        stored
            .spec
            .as_mut()
            .unwrap()
            .validations
            .as_mut()
            .unwrap()
            .pop();
        assert!(!is_current(&stored, &desired), "a rule dropped by hand");
    }

    #[test]
    fn a_selector_becomes_a_condition_on_either_object_and_label_less_subresources_are_fenced() {
        let selector: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"app": "bo'oks"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "team", "operator": "NotIn", "values": ["x"]},
                {"key": "db", "operator": "Exists"},
                {"key": "tmp", "operator": "DoesNotExist"},
            ],
        }))
        .unwrap();
        let condition = selected(&selector);
        assert!(
            condition.starts_with(
                "(has(request.subResource) && !(request.subResource in ['', 'status'])) || "
            ),
            "{condition}"
        );
        for part in [
            r"o.metadata.labels['app'] == 'bo\'oks'",
            "o.metadata.labels['tier'] in ['a', 'b']",
            "!((has(o.metadata.labels) && 'team' in o.metadata.labels) && o.metadata.labels['team'] in ['x'])",
            "!(has(o.metadata.labels) && 'tmp' in o.metadata.labels)",
            "[object, oldObject].exists(o, o != null && ",
        ] {
            assert!(condition.contains(part), "{part} not in {condition}");
        }
        let policy = desired_kinds_policy("ns", "l", &fence()).unwrap();
        let spec = policy.spec.unwrap();
        assert_eq!(spec.match_conditions.unwrap()[0].name, "selected");
        assert_eq!(
            spec.match_constraints.unwrap().object_selector,
            None,
            "a scale carries no labels: an objectSelector would never match it"
        );
        let all: FenceSpec =
            serde_json::from_value(serde_json::json!({"resources": [{"resource": "configmaps"}]}))
                .unwrap();
        let policy = desired_kinds_policy("ns", "l", &all).unwrap();
        assert_eq!(policy.spec.unwrap().match_conditions, None);
    }

    #[test]
    fn a_template_without_the_lease_rules_is_an_error_not_a_panic() {
        assert!(template("kind: ConfigMap\n").is_err());
        assert!(template(": not yaml [").is_err());
    }
}
