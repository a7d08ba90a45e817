//! The lease rules of the object fence. For each FencedLease the operator keeps up to two
//! ValidatingAdmissionPolicyBindings of policy [`LEASE_POLICY`]
//! (`deploy/admission/fence-policy.yaml`), each with the lease itself as params
//! (`paramRef.name`, `parameterNotFoundAction: Deny`):
//! - `fenced-lease.<ns>.<lease>`, while `spec.fenceObjects` is on: the objects of the lease's
//!   namespace labelled `fencing.dev/lease=<lease>`;
//! - `fenced-lease-kinds.<ns>.<lease>`, while `spec.fence` is set: the objects of the kinds it
//!   names (and its selector) in the lease's namespace, every subresource included.
//!
//! The apiserver then refuses a write to such an object by a pod that is not the lease's
//! holder, or whose token is below the lease's `status.fencingToken`.
//!
//! A binding is cluster-scoped and cannot be owned by a namespaced lease, so nothing garbage
//! collects it: the operator deletes it when its field is turned off, when the lease is
//! deleted (before its finalizer goes), and, after every (re)list of its bindings and every
//! five minutes, any whose lease the API says is gone. Every step is idempotent and safe if
//! the one before never ran. The operator's bindings are labelled, and watched into a cache,
//! so that an unchanged lease costs no API call.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, ParamRef, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::context::Context;
use super::error::{Error, Result, timed};
use crate::api::{FenceSpec, FencedLease, LEASE_LABEL};
use crate::fence::kube::LEASE_POLICY;

/// Label naming who manages a binding, and the value the operator sets.
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "fenced-lease-operator");
/// Labels naming the lease a binding is for.
const LEASE_NAMESPACE_LABEL: &str = "fencing.dev/lease-namespace";
const LEASE_NAME_LABEL: &str = "fencing.dev/lease-name";
/// How often bindings are checked for a lease that is gone, besides after every (re)list.
const ORPHAN_SWEEP: Duration = Duration::from_secs(300);
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
/// `fence` names, in the lease's namespace, with all their subresources.
pub fn desired_kinds_binding(
    ns: &str,
    name: &str,
    fence: &FenceSpec,
) -> ValidatingAdmissionPolicyBinding {
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
    binding(
        kinds_binding_name(ns, name),
        ns,
        name,
        MatchResources {
            namespace_selector: Some(selector("kubernetes.io/metadata.name", ns)),
            object_selector: fence.selector.clone(),
            resource_rules: Some(rules),
            ..Default::default()
        },
    )
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
            labels: Some(BTreeMap::from([
                (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
                (LEASE_NAMESPACE_LABEL.to_string(), ns.to_string()),
                (LEASE_NAME_LABEL.to_string(), name.to_string()),
            ])),
            ..Default::default()
        },
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: LEASE_POLICY.into(),
            validation_actions: vec!["Deny".into()],
            param_ref: Some(ParamRef {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                // A missing lease refuses the write rather than letting it through.
                parameter_not_found_action: Some("Deny".into()),
                selector: None,
            }),
            match_resources: Some(match_resources),
        },
    }
}

/// A binding lease `ns/name` may have: its name, the binding to keep (`None`: delete it), and
/// whether the spec asks for one (a binding it does not ask for is deleted only when the cache
/// shows it; one of a lease being deleted is always asked for).
type Wanted = (String, Option<ValidatingAdmissionPolicyBinding>, bool);

fn desired_bindings(ns: &str, name: &str, lease: &FencedLease) -> [Wanted; 2] {
    let live = lease.metadata.deletion_timestamp.is_none();
    let spec = &lease.spec;
    [
        (
            binding_name(ns, name),
            (spec.fence_objects && live).then(|| desired_binding(ns, name)),
            spec.fence_objects,
        ),
        (
            kinds_binding_name(ns, name),
            spec.fence
                .as_ref()
                .filter(|_| live)
                .map(|fence| desired_kinds_binding(ns, name, fence)),
            spec.fence.is_some(),
        ),
    ]
}

fn selector(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
        match_expressions: None,
    }
}

/// The part of a binding's match that decides what it matches, without the defaults the
/// apiserver adds (`matchPolicy`, empty selectors and lists).
fn matching(m: &Option<MatchResources>) -> MatchResources {
    let m = m.clone().unwrap_or_default();
    let selector = |s: Option<LabelSelector>| s.filter(|s| *s != LabelSelector::default());
    let rules = |r: Option<Vec<NamedRuleWithOperations>>| r.filter(|r| !r.is_empty());
    MatchResources {
        match_policy: None,
        namespace_selector: selector(m.namespace_selector),
        object_selector: selector(m.object_selector),
        resource_rules: rules(m.resource_rules),
        exclude_resource_rules: rules(m.exclude_resource_rules),
    }
}

/// Does `existing` say what `desired` says? (The apiserver adds defaults; they are ignored.)
fn is_current(
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

/// The operator's bindings, watched into a cache.
#[derive(Clone)]
pub struct FenceBindings {
    store: Store<ValidatingAdmissionPolicyBinding>,
    /// When this process last wrote each binding, while that is less than [`BINDING_SETTLE`] ago.
    written: Arc<Mutex<HashMap<String, Instant>>>,
}

impl FenceBindings {
    /// Watches the operator's bindings (only those of `namespace` when the operator watches
    /// one) until `stop`, and after every (re)list and every five minutes deletes those whose
    /// lease is gone. A binding changed or deleted by someone else sends its lease to
    /// `triggers`, whose reconcile puts it back.
    pub fn start(
        client: Client,
        namespace: Option<String>,
        api_timeout: Duration,
        triggers: tokio::sync::mpsc::UnboundedSender<ObjectRef<FencedLease>>,
        stop: CancellationToken,
    ) -> Self {
        let mut labels = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
        if let Some(ns) = &namespace {
            labels.push_str(&format!(",{LEASE_NAMESPACE_LABEL}={ns}"));
        }
        let api: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
        let (store, writer) = reflector::store();
        let stream = watcher(api, watcher::Config::default().labels(&labels))
            .default_backoff()
            .reflect(writer);
        let cache = store.clone();
        tokio::spawn(async move {
            let stream = stream.take_until(stop.cancelled_owned());
            futures::pin_mut!(stream);
            let mut sweep = tokio::time::interval(ORPHAN_SWEEP);
            sweep.tick().await; // the first tick is immediate; the first list sweeps
            loop {
                tokio::select! {
                    event = stream.next() => match event {
                        None => break,
                        Some(Ok(watcher::Event::InitDone)) => {
                            tokio::spawn(remove_orphans(client.clone(), cache.state(), api_timeout));
                        }
                        Some(Ok(watcher::Event::Apply(b) | watcher::Event::Delete(b))) => {
                            let labels = b.labels();
                            if let (Some(ns), Some(lease)) =
                                (labels.get(LEASE_NAMESPACE_LABEL), labels.get(LEASE_NAME_LABEL))
                            {
                                let _ = triggers.send(ObjectRef::new(lease).within(ns));
                            }
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            warn!(watch = "validatingadmissionpolicybindings", error = %e, "watch failed; retrying with backoff")
                        }
                    },
                    _ = sweep.tick() => {
                        tokio::spawn(remove_orphans(client.clone(), cache.state(), api_timeout));
                    }
                }
            }
        });
        FenceBindings {
            store,
            written: Arc::default(),
        }
    }

    fn cached(&self, name: &str) -> Option<Arc<ValidatingAdmissionPolicyBinding>> {
        self.store.get(&ObjectRef::new(name))
    }

    /// Notes that binding `name` was written now.
    fn wrote(&self, name: &str) {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        written.retain(|_, at| at.elapsed() < BINDING_SETTLE);
        written.insert(name.to_string(), Instant::now());
    }

    /// When binding `name`, written by this process, is taken to be in force, if not yet.
    fn settling(&self, name: &str) -> Option<Instant> {
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let in_force = *written.get(name)? + BINDING_SETTLE;
        (in_force > Instant::now()).then_some(in_force)
    }
}

/// Brings the bindings of `lease` in line with its spec: each applied while its field is
/// set, deleted when it is not or the lease is being deleted. Returns when the bindings it
/// keeps are in force, if that is still to come: one created or restored less than
/// [`BINDING_SETTLE`] ago may not be enforced yet.
pub async fn sync(ctx: &Context, lease: &FencedLease) -> Result<Option<Instant>> {
    let ns = lease
        .namespace()
        .ok_or_else(|| Error::Unexpected("FencedLease without a namespace".into()))?;
    let name = lease.name_any();
    let mut in_force = None;
    for (binding, desired, asked) in desired_bindings(&ns, &name, lease) {
        let cached = ctx.fence_bindings.cached(&binding);
        match desired {
            Some(desired) => {
                apply(ctx, lease, cached, desired).await?;
                in_force = in_force.max(ctx.fence_bindings.settling(&binding));
            }
            // Leases that never fence objects cost no call, and no RBAC rule.
            None if cached.is_some() || asked => remove(ctx, &ns, &name, &binding).await?,
            None => {}
        }
    }
    Ok(in_force)
}

/// Creates `desired`, or puts it back whole over an edited copy.
async fn apply(
    ctx: &Context,
    lease: &FencedLease,
    cached: Option<Arc<ValidatingAdmissionPolicyBinding>>,
    desired: ValidatingAdmissionPolicyBinding,
) -> Result<()> {
    if cached.as_deref().is_some_and(|b| is_current(b, &desired)) {
        return Ok(());
    }
    let api: Api<ValidatingAdmissionPolicyBinding> = Api::all(ctx.client.clone());
    let binding = desired.name_any();
    // The operator owns the whole binding: created, and put back whole (a replace on the
    // resourceVersion it read, not a merge that would keep someone else's list items)
    // when edited by hand. A binding the API has but the cache has not seen yet makes
    // the create 409: the watch brings it, and the lease is reconciled again.
    match &cached {
        None => timed(
            "create fence binding",
            ctx.api_timeout,
            api.create(&PostParams::default(), &desired),
        )
        .await
        .map(drop),
        Some(current) => {
            let mut next = desired;
            next.metadata.resource_version = current.metadata.resource_version.clone();
            timed(
                "restore fence binding",
                ctx.api_timeout,
                api.replace(&binding, &PostParams::default(), &next),
            )
            .await
            .map(drop)
        }
    }?;
    ctx.fence_bindings.wrote(&binding);
    info!(lease = %lease.name_any(), binding = %binding, "fence binding applied");
    if cached.is_none() {
        warn_if_policy_missing(ctx, lease).await;
    }
    Ok(())
}

async fn remove(ctx: &Context, ns: &str, name: &str, binding: &str) -> Result<()> {
    let api: Api<ValidatingAdmissionPolicyBinding> = Api::all(ctx.client.clone());
    match timed(
        "delete fence binding",
        ctx.api_timeout,
        api.delete(binding, &DeleteParams::default()),
    )
    .await
    {
        Ok(_) => {
            info!(lease = %name, namespace = %ns, binding = %binding, "fence binding deleted")
        }
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e),
    }
    Ok(())
}

/// A binding of a policy that is not installed enforces nothing: say so on the lease.
async fn warn_if_policy_missing(ctx: &Context, lease: &FencedLease) {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(ctx.client.clone());
    if let Ok(None) = timed(
        "read fence policy",
        ctx.api_timeout,
        policies.get_opt(LEASE_POLICY),
    )
    .await
    {
        let note = format!(
            "the lease fences objects (spec.fenceObjects or spec.fence), but ValidatingAdmissionPolicy {LEASE_POLICY} is not installed (deploy/admission/fence-policy.yaml): objects are not fenced by this lease"
        );
        warn!(lease = %lease.name_any(), "{note}");
        ctx.event(
            &lease.object_ref(&()),
            EventType::Warning,
            "FencePolicyMissing",
            "FenceObjects",
            note,
        );
    }
}

/// Deletes the bindings whose lease the API says does not exist (deleted while no operator
/// ran its finalizer, say). A binding re-created meanwhile (another UID) is left alone.
async fn remove_orphans(
    client: Client,
    bindings: Vec<Arc<ValidatingAdmissionPolicyBinding>>,
    api_timeout: Duration,
) {
    let api: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    for binding in bindings {
        let labels = binding.labels();
        let (Some(ns), Some(name)) = (
            labels.get(LEASE_NAMESPACE_LABEL),
            labels.get(LEASE_NAME_LABEL),
        ) else {
            continue;
        };
        let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
        match timed("read lease", api_timeout, leases.get_opt(name)).await {
            Ok(None) => {}
            Ok(Some(_)) => continue,
            Err(e) => {
                warn!(lease = %name, namespace = %ns, error = %e, "cannot check the lease of a fence binding");
                continue;
            }
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: binding.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let binding_name = binding.name_any();
        match timed(
            "delete fence binding",
            api_timeout,
            api.delete(&binding_name, &params),
        )
        .await
        {
            Ok(_) => {
                info!(lease = %name, namespace = %ns, binding = %binding_name, "deleted the fence binding of a lease that is gone")
            }
            Err(e) if e.is_not_found() || e.is_conflict() => {}
            Err(e) => {
                warn!(binding = %binding_name, error = %e, "cannot delete the fence binding of a lease that is gone")
            }
        }
    }
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
        assert_eq!(param.parameter_not_found_action.as_deref(), Some("Deny"));
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
        assert_eq!(m.object_selector, fence.selector);
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
            desired_bindings("ns", "books", lease)
                .map(|(name, desired, asked)| (name, desired.is_some(), asked))
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
