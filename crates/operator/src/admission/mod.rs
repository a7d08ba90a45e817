//! The fence of Kubernetes objects: the admission objects the apiserver enforces it with, and
//! whether they are in force for a lease.
//!
//! Every one is installed with the project (`deploy/admission/`, the chart); their number does
//! not grow with leases, so neither does the apiserver's work per write:
//! - `fenced-lease-object-token`: a labelled object's token never goes down (no params);
//! - `fenced-lease-lease-token` with binding `fenced-lease-objects`: the lease rules (identity,
//!   current token) for objects labelled `fencing.dev/lease`;
//! - the kinds slots `fenced-lease-kinds-NN` ([`shipped::SLOTS`]): the same rules for the kinds
//!   leases name in `spec.fence`. Each slot matches one kind in the namespaces whose leases
//!   fence it, which the operator keeps up to date ([`sync`]); the only admission writes it
//!   makes are updates of these policies.
//!
//! Each binding asks every FencedLease of the written object's namespace (a `paramRef`
//! selector), and a lease that does not fence the object applies no rule: a namespace's
//! leases are the only ones a write pays for. A lease that is gone fences nothing.
//!
//! A slot matches no more than what it fences because the apiserver refuses *every* write a
//! policy matches while it cannot resolve the policy's params kind (for up to 30 s after it
//! starts, before it has discovered the FencedLease CRD; kubernetes/kubernetes#124237).
//!
//! A lease is granted only while its fence is in force ([`Admission::check`]): the objects it
//! needs are installed as shipped, its kinds have a slot that lists its namespace, and the
//! apiserver has had [`SETTLE`] to take in a slot's newly listed namespace.

pub mod shipped;
pub mod slots;
pub mod sync;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Notify;

use fenced_lease_api::{FencedLease, FencedResource};
use shipped::{LEASE_POLICY, OBJECTS_BINDING, binding_is_intact, policy_is_current, slot_name};

/// How long after a slot's update lists a namespace its leases wait before they are granted:
/// the apiserver enforces a policy only once its informers deliver it, and the first holder's
/// term must be fenced from its start.
pub const SETTLE: Duration = Duration::from_secs(2);

/// Whether a lease's fence is in force.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    InForce,
    /// In force from then on.
    Settling(Instant),
    /// Its slots are being updated: the lease is reconciled again when they are.
    Pending,
    /// It cannot be put in place, for this reason: the lease is not granted until it is.
    NotInForce(String),
}

/// The operator's view of the admission objects, and the kinds slots' keeper's state.
#[derive(Clone)]
pub struct Admission {
    pub(crate) policies: Store<ValidatingAdmissionPolicy>,
    pub(crate) bindings: Store<ValidatingAdmissionPolicyBinding>,
    pub(crate) state: Arc<Mutex<State>>,
    pub(crate) poke: Arc<Notify>,
}

/// What the keeper of the slots knows that the stored objects do not say.
#[derive(Default)]
pub(crate) struct State {
    /// The kinds of admission object whose watch has listed them.
    pub listed_kinds: BTreeSet<String>,
    /// Why a watch of admission objects cannot list them, while it cannot.
    pub unreadable: Option<String>,
    /// Kinds wanted that no slot is free for.
    pub unplaced: BTreeSet<FencedResource>,
    /// Why the last update of a slot failed, if it did.
    pub error: Option<String>,
    /// When this process listed a namespace in a kind's slot, while less than [`SETTLE`] ago.
    pub listed: BTreeMap<(FencedResource, String), Instant>,
    /// Leases found [`Check::Pending`], reconciled again after the keeper's next round.
    pub pending: BTreeSet<(String, String)>,
    /// The kinds each lease fenced when last reconciled, to notice a change of `spec.fence`.
    pub kinds_of: HashMap<(String, String), BTreeSet<FencedResource>>,
}

impl Admission {
    pub fn new(
        policies: Store<ValidatingAdmissionPolicy>,
        bindings: Store<ValidatingAdmissionPolicyBinding>,
    ) -> Self {
        Admission {
            policies,
            bindings,
            state: Arc::default(),
            poke: Arc::default(),
        }
    }

    /// Is the fence `lease` asks for in force? Reads the caches only. A lease whose kinds
    /// changed since it was last asked about gets the slots brought in line.
    pub fn check(&self, lease: &FencedLease) -> Check {
        let (ns, name) = (lease.namespace().unwrap_or_default(), lease.name_any());
        self.note(&ns, &name, lease);
        if !lease.spec.fence_objects && lease.spec.fence.is_none() {
            return Check::InForce;
        }
        if !self.is_ready() {
            // Not matched on the lock itself: its guard would live through `pend`.
            let unreadable = self.lock().unreadable.clone();
            return match unreadable {
                Some(why) => {
                    Check::NotInForce(format!("the admission objects cannot be read: {why}"))
                }
                None => {
                    self.pend(&ns, &name);
                    Check::Pending
                }
            };
        }
        if lease.spec.fence_objects
            && let Some(gap) = self.objects_gap()
        {
            return Check::NotInForce(gap);
        }
        let mut settled = None::<Instant>;
        for kind in lease.spec.fence.iter().flat_map(|f| &f.resources) {
            match self.kind_check(kind, &ns, &name) {
                Check::InForce => {}
                Check::Settling(at) => settled = Some(settled.map_or(at, |s| s.max(at))),
                other => return other,
            }
        }
        settled.map_or(Check::InForce, Check::Settling)
    }

    /// Why labelled objects are not fenced, if they are not.
    fn objects_gap(&self) -> Option<String> {
        let policy = self.policies.get(&ObjectRef::new(LEASE_POLICY));
        let current = |p: &ValidatingAdmissionPolicy| {
            shipped::lease_rules().is_ok_and(|rules| {
                let desired = ValidatingAdmissionPolicy {
                    spec: Some(rules.clone()),
                    ..Default::default()
                };
                policy_is_current(p, &desired)
            })
        };
        if !policy.as_deref().is_some_and(current) {
            return Some(format!(
                "ValidatingAdmissionPolicy {LEASE_POLICY} is {} (deploy/admission/fence-policy.yaml, installed by the chart)",
                if policy.is_some() {
                    "not as this operator was built with it"
                } else {
                    "not installed"
                }
            ));
        }
        self.binding_gap(OBJECTS_BINDING, LEASE_POLICY).map(|how| format!(
            "ValidatingAdmissionPolicyBinding {OBJECTS_BINDING} is {how} (deploy/admission/fence-policy.yaml, installed by the chart)"
        ))
    }

    /// How binding `name` differs from one that binds `policy` as shipped, if it does.
    fn binding_gap(&self, name: &str, policy: &str) -> Option<&'static str> {
        match self.bindings.get(&ObjectRef::new(name)) {
            Some(b) if binding_is_intact(&b, policy) => None,
            Some(_) => Some("not as shipped"),
            None => Some("not installed"),
        }
    }

    /// Is `kind` fenced in `ns`: a slot lists it, as shipped, with its binding?
    fn kind_check(&self, kind: &FencedResource, ns: &str, lease_name: &str) -> Check {
        let what = format!("{}", Kind(kind));
        for i in 0..shipped::SLOTS {
            let name = slot_name(i);
            let Some(policy) = self.policies.get(&ObjectRef::new(&name)) else {
                continue;
            };
            let Ok(Some(assigned)) = shipped::assignment(&policy) else {
                continue;
            };
            if assigned.kind != *kind || !assigned.namespaces.contains(ns) {
                continue;
            }
            let desired = shipped::slot_policy(i, Some(&assigned));
            if !desired.is_ok_and(|d| policy_is_current(&policy, &d)) {
                self.pend(ns, lease_name); // edited by hand: the keeper puts it back
                return Check::Pending;
            }
            if let Some(how) = self.binding_gap(&name, &name) {
                return Check::NotInForce(format!(
                    "ValidatingAdmissionPolicyBinding {name}, which fences {what}, is {how} (deploy/admission/{}, installed by the chart)",
                    shipped::SLOTS_FILE
                ));
            }
            let state = self.lock();
            return match state.listed.get(&(kind.clone(), ns.to_string())) {
                Some(at) if at.elapsed() < SETTLE => Check::Settling(*at + SETTLE),
                _ => Check::InForce,
            };
        }
        if (0..shipped::SLOTS).all(|i| self.policies.get(&ObjectRef::new(&slot_name(i))).is_none())
        {
            return Check::NotInForce(format!(
                "the kinds slots that fence {what} are not installed (deploy/admission/{}, installed by the chart)",
                shipped::SLOTS_FILE
            ));
        }
        let state = self.lock();
        if state.unplaced.contains(kind) {
            return Check::NotInForce(format!(
                "no kinds slot is free for {what}: the cluster's leases already fence {} other kinds (deploy/admission/{})",
                shipped::SLOTS,
                shipped::SLOTS_FILE
            ));
        }
        if let Some(error) = &state.error {
            return Check::NotInForce(format!(
                "the kinds slot for {what} cannot be updated: {error}"
            ));
        }
        drop(state);
        self.pend(ns, lease_name);
        Check::Pending
    }

    /// Lease `ns/name` waits on the keeper: it runs, and reconciles the lease after.
    fn pend(&self, ns: &str, name: &str) {
        self.lock()
            .pending
            .insert((ns.to_string(), name.to_string()));
        self.poke.notify_one();
    }

    /// Remembers the kinds lease `ns/name` fences; a change has the slots brought in line.
    fn note(&self, ns: &str, name: &str, lease: &FencedLease) {
        let kinds: BTreeSet<FencedResource> = lease
            .spec
            .fence
            .iter()
            .flat_map(|f| f.resources.iter().cloned())
            .collect();
        let key = (ns.to_string(), name.to_string());
        let mut state = self.lock();
        let changed = match state.kinds_of.get(&key) {
            Some(before) => *before != kinds,
            None => !kinds.is_empty(),
        };
        if kinds.is_empty() {
            state.kinds_of.remove(&key);
        } else {
            state.kinds_of.insert(key, kinds);
        }
        drop(state);
        if changed {
            self.poke.notify_one();
        }
    }

    /// Lease `ns/name` is gone: the slots no longer list its kinds there for it.
    pub fn forget(&self, ns: &str, name: &str) {
        let removed = self
            .lock()
            .kinds_of
            .remove(&(ns.to_string(), name.to_string()));
        if removed.is_some() {
            self.poke.notify_one();
        }
    }

    /// Have the watches of policies and bindings listed them?
    pub fn is_ready(&self) -> bool {
        self.lock().listed_kinds.len() == 2
    }

    /// Notes that the slots list these (kind, namespace) pairs from now on.
    pub(crate) fn listed(&self, pairs: &[(FencedResource, String)]) {
        let now = Instant::now();
        let mut state = self.lock();
        state.listed.retain(|_, at| at.elapsed() < SETTLE);
        state.listed.extend(pairs.iter().map(|p| (p.clone(), now)));
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A kind as a user names it: `deployments.apps`, `configmaps`.
pub struct Kind<'a>(pub &'a FencedResource);

impl std::fmt::Display for Kind<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.group.as_str() {
            "" => write!(f, "{}", self.0.resource),
            group => write!(f, "{}.{group}", self.0.resource),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::{self, store::Writer};
    use kube::runtime::watcher;

    fn lease(spec: serde_json::Value) -> FencedLease {
        let mut lease = FencedLease::new("books", serde_json::from_value(spec).unwrap());
        lease.metadata.namespace = Some("shop".into());
        lease
    }

    /// No admission objects, their watches not listed.
    fn unlisted() -> Admission {
        Admission::new(reflector::store().0, reflector::store().0)
    }

    fn fill<K>(writer: &mut Writer<K>, objects: Vec<K>)
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        writer.apply_watcher_event(&watcher::Event::Init);
        for o in objects {
            writer.apply_watcher_event(&watcher::Event::InitApply(o));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
    }

    /// The shipped objects, with slot 0 fencing ConfigMaps in `namespaces`.
    fn admission(namespaces: &[&str]) -> Admission {
        let (policies, mut pw) = reflector::store();
        let (bindings, mut bw) = reflector::store();
        let configmaps = shipped::Assignment {
            kind: FencedResource {
                group: String::new(),
                resource: "configmaps".into(),
            },
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
        };
        let mut all = vec![ValidatingAdmissionPolicy {
            metadata: kube::api::ObjectMeta {
                name: Some(LEASE_POLICY.into()),
                ..Default::default()
            },
            spec: Some(shipped::lease_rules().unwrap().clone()),
            status: None,
        }];
        let assigned = (!namespaces.is_empty()).then_some(&configmaps);
        all.push(shipped::slot_policy(0, assigned).unwrap());
        all.extend((1..shipped::SLOTS).map(|i| shipped::slot_policy(i, None).unwrap()));
        fill(&mut pw, all);
        let mut objects = shipped::slot_binding(0);
        objects.metadata.name = Some(OBJECTS_BINDING.into());
        objects.spec.policy_name = LEASE_POLICY.into();
        let mut bound: Vec<_> = (0..shipped::SLOTS).map(shipped::slot_binding).collect();
        bound.push(objects);
        fill(&mut bw, bound);
        let admission = Admission::new(policies, bindings);
        for kind in [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ] {
            admission.lock().listed_kinds.insert(kind.into());
        }
        admission
    }

    #[test]
    fn a_lease_is_in_force_once_its_kinds_slot_lists_its_namespace_and_has_settled() {
        let configmaps =
            lease(serde_json::json!({"fence": {"resources": [{"resource": "configmaps"}]}}));
        assert_eq!(admission(&["shop"]).check(&configmaps), Check::InForce);
        assert_eq!(admission(&["other"]).check(&configmaps), Check::Pending);
        let a = admission(&["shop"]);
        a.listed(&[(
            configmaps.spec.fence.as_ref().unwrap().resources[0].clone(),
            "shop".into(),
        )]);
        assert!(matches!(a.check(&configmaps), Check::Settling(_)));
        let labelled = lease(serde_json::json!({"fenceObjects": true}));
        assert_eq!(admission(&[]).check(&labelled), Check::InForce);
        let nothing = lease(serde_json::json!({}));
        assert_eq!(unlisted().check(&nothing), Check::InForce, "fences nothing");
    }

    #[test]
    fn a_lease_says_why_its_fence_is_not_in_force() {
        let a = admission(&[]);
        let secrets = FencedResource {
            group: String::new(),
            resource: "secrets".into(),
        };
        a.lock().unplaced.insert(secrets);
        let check = a.check(&lease(
            serde_json::json!({"fence": {"resources": [{"resource": "secrets"}]}}),
        ));
        assert!(
            matches!(&check, Check::NotInForce(why) if why.contains("no kinds slot is free for secrets")),
            "{check:?}"
        );
        let none = unlisted();
        none.lock()
            .listed_kinds
            .extend(["a".to_string(), "b".to_string()]);
        let check = none.check(&lease(serde_json::json!({"fenceObjects": true})));
        assert!(
            matches!(&check, Check::NotInForce(why) if why.contains("not installed")),
            "{check:?}"
        );
    }

    /// Before the watches have listed the objects: pending (or why they cannot be read), and
    /// never a lock held while the lease is noted as pending.
    #[test]
    fn before_the_objects_are_listed_a_lease_waits_and_the_check_returns() {
        let (done, wait) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let a = unlisted();
            let check = a.check(&lease(serde_json::json!({"fenceObjects": true})));
            let pending = a.lock().pending.len();
            a.lock().unreadable = Some("forbidden".into());
            let _ = done.send((
                check,
                pending,
                a.check(&lease(serde_json::json!({"fenceObjects": true}))),
            ));
        });
        let (first, pending, second) = wait
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("check() returned (no deadlock)");
        assert_eq!((first, pending), (Check::Pending, 1));
        assert!(matches!(second, Check::NotInForce(why) if why.contains("forbidden")));
    }
}
