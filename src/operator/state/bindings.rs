//! The operator's admission objects (policy bindings, and the policies of kinds bindings) as
//! watched, and when it last wrote each.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::Resource;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, ObjectRef, Store};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::operator::core::fence::BINDING_SETTLE;

/// The operator's bindings, watched into a cache.
pub type BindingCache = FenceObjects<ValidatingAdmissionPolicyBinding>;
/// The operator's policies (those of kinds bindings), watched into a cache.
pub type PolicyCache = FenceObjects<ValidatingAdmissionPolicy>;

/// The admission objects the operator keeps per lease: cluster-scoped, watched, written whole.
pub trait FenceObject:
    Resource<DynamicType = ()> + Clone + Debug + Send + Sync + Serialize + DeserializeOwned + 'static
{
    /// What they are, plural, for logs.
    const WHAT: &'static str;
}

impl FenceObject for ValidatingAdmissionPolicyBinding {
    const WHAT: &'static str = "fence bindings";
}

impl FenceObject for ValidatingAdmissionPolicy {
    const WHAT: &'static str = "fence policies";
}

/// Cluster-scoped admission objects of the operator, watched into a cache.
pub struct FenceObjects<K: Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    /// When this process last wrote each object, while that is less than [`BINDING_SETTLE`] ago.
    written: Arc<Mutex<HashMap<String, Instant>>>,
}

impl<K: Resource<DynamicType = ()> + 'static> Clone for FenceObjects<K> {
    fn clone(&self) -> Self {
        FenceObjects {
            store: self.store.clone(),
            written: self.written.clone(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> FenceObjects<K> {
    /// An empty cache, and the writer its watch fills it with.
    pub fn new() -> (Self, Writer<K>) {
        let (store, writer) = reflector::store();
        let cache = FenceObjects {
            store,
            written: Arc::default(),
        };
        (cache, writer)
    }

    /// Every object cached.
    pub fn all(&self) -> Vec<Arc<K>> {
        self.store.state()
    }

    pub fn cached(&self, name: &str) -> Option<Arc<K>> {
        self.store.get(&ObjectRef::new(name))
    }

    /// Notes that object `name` was written now.
    pub fn wrote(&self, name: &str) {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        written.retain(|_, at| at.elapsed() < BINDING_SETTLE);
        written.insert(name.to_string(), Instant::now());
    }

    /// When object `name`, written by this process, is taken to be in force, if not yet.
    pub fn settling(&self, name: &str) -> Option<Instant> {
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let in_force = *written.get(name)? + BINDING_SETTLE;
        (in_force > Instant::now()).then_some(in_force)
    }
}
