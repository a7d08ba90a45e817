//! The operator's admission policy bindings as watched, and when it last wrote each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, ObjectRef, Store};

use crate::operator::core::fence::BINDING_SETTLE;

/// The operator's bindings, watched into a cache.
#[derive(Clone)]
pub struct BindingCache {
    store: Store<ValidatingAdmissionPolicyBinding>,
    /// When this process last wrote each binding, while that is less than [`BINDING_SETTLE`] ago.
    written: Arc<Mutex<HashMap<String, Instant>>>,
}

impl BindingCache {
    /// An empty cache, and the writer its watch fills it with.
    pub fn new() -> (Self, Writer<ValidatingAdmissionPolicyBinding>) {
        let (store, writer) = reflector::store();
        let cache = BindingCache {
            store,
            written: Arc::default(),
        };
        (cache, writer)
    }

    /// Every binding cached.
    pub fn all(&self) -> Vec<Arc<ValidatingAdmissionPolicyBinding>> {
        self.store.state()
    }

    pub fn cached(&self, name: &str) -> Option<Arc<ValidatingAdmissionPolicyBinding>> {
        self.store.get(&ObjectRef::new(name))
    }

    /// Notes that binding `name` was written now.
    pub fn wrote(&self, name: &str) {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        written.retain(|_, at| at.elapsed() < BINDING_SETTLE);
        written.insert(name.to_string(), Instant::now());
    }

    /// When binding `name`, written by this process, is taken to be in force, if not yet.
    pub fn settling(&self, name: &str) -> Option<Instant> {
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let in_force = *written.get(name)? + BINDING_SETTLE;
        (in_force > Instant::now()).then_some(in_force)
    }
}
