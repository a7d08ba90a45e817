//! A cache of watched objects kept in the operator's own types (claims, pods), by namespace
//! and name: each namespace has a map of its own, and an object's name is its only key string
//! (not an `ObjectRef` per object, with its own copies of the name, namespace, UID and version).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use kube::runtime::watcher;
use tokio::sync::watch;

/// A watch event with its object turned into the type it is cached as.
pub fn map_event<A, B>(event: watcher::Event<A>, into: impl FnOnce(A) -> B) -> watcher::Event<B> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(into(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(into(o)),
        watcher::Event::InitApply(o) => watcher::Event::InitApply(into(o)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Where an object is cached.
pub trait Keyed {
    fn namespace(&self) -> &str;
    fn name(&self) -> &str;
}

impl Keyed for fenced_lease_api::FencedLease {
    fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
}

type Map<K> = HashMap<Arc<str>, HashMap<Box<str>, Arc<K>>>;

/// The readable side; clones share one cache.
pub struct Cache<K> {
    map: Arc<RwLock<Map<K>>>,
    ready: watch::Receiver<bool>,
}

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Self {
            map: self.map.clone(),
            ready: self.ready.clone(),
        }
    }
}

/// The writer went away before the first list completed.
#[derive(Debug)]
pub struct NeverReady;

impl<K: Keyed + Clone> Cache<K> {
    /// An empty cache and the writer that fills it from a watch.
    pub fn new() -> (Cache<K>, Writer<K>) {
        let (ready_tx, ready) = watch::channel(false);
        let cache = Cache {
            map: Default::default(),
            ready,
        };
        let writer = Writer {
            cache: cache.clone(),
            buffer: None,
            ready: ready_tx,
        };
        (cache, writer)
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        map.get(namespace)?.get(name).cloned()
    }

    /// Every object, in no order.
    pub fn state(&self) -> Vec<Arc<K>> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        map.values().flat_map(|m| m.values().cloned()).collect()
    }

    pub fn len(&self) -> usize {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        map.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until the first list has been applied.
    pub async fn ready(&self) -> Result<(), NeverReady> {
        let mut ready = self.ready.clone();
        ready
            .wait_for(|r| *r)
            .await
            .map(|_| ())
            .map_err(|_| NeverReady)
    }
}

fn insert<K: Keyed>(map: &mut Map<K>, object: Arc<K>) {
    let ns = object.namespace();
    let names = match map.get_mut(ns) {
        Some(names) => names,
        None => map.entry(Arc::from(ns)).or_default(),
    };
    names.insert(Box::from(object.name()), object);
}

/// Fills a [`Cache`] from a watch's events, as kube-runtime's reflector does: a relist is
/// buffered and replaces the whole cache when it completes.
pub struct Writer<K> {
    cache: Cache<K>,
    buffer: Option<Map<K>>,
    ready: watch::Sender<bool>,
}

impl<K: Keyed + Clone> Writer<K> {
    pub fn apply(&mut self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(o) => {
                let mut map = self.cache.map.write().unwrap_or_else(|e| e.into_inner());
                insert(&mut map, Arc::new(o.clone()));
            }
            watcher::Event::Delete(o) => {
                let mut map = self.cache.map.write().unwrap_or_else(|e| e.into_inner());
                if let Some(names) = map.get_mut(o.namespace()) {
                    names.remove(o.name());
                    if names.is_empty() {
                        map.remove(o.namespace());
                    }
                }
            }
            watcher::Event::Init => self.buffer = Some(Map::new()),
            watcher::Event::InitApply(o) => {
                insert(self.buffer.get_or_insert_default(), Arc::new(o.clone()));
            }
            watcher::Event::InitDone => {
                let listed = self.buffer.take().unwrap_or_default();
                *self.cache.map.write().unwrap_or_else(|e| e.into_inner()) = listed;
                self.ready.send_replace(true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct O(&'static str, &'static str, u32);

    impl Keyed for O {
        fn namespace(&self) -> &str {
            self.0
        }
        fn name(&self) -> &str {
            self.1
        }
    }

    #[tokio::test]
    async fn a_relist_replaces_the_cache_when_it_completes_and_makes_it_ready() {
        let (cache, mut writer) = Cache::<O>::new();
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(10), cache.ready())
                .await
                .is_err()
        );
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(O("a", "x", 1)));
        assert!(cache.get("a", "x").is_none(), "a list shows only when done");
        writer.apply(&watcher::Event::InitDone);
        cache.ready().await.unwrap();
        assert_eq!(cache.get("a", "x").as_deref(), Some(&O("a", "x", 1)));

        writer.apply(&watcher::Event::Apply(O("a", "x", 2)));
        writer.apply(&watcher::Event::Apply(O("b", "x", 1)));
        assert_eq!(cache.get("a", "x").as_deref(), Some(&O("a", "x", 2)));
        assert_eq!(cache.len(), 2);

        // A relist that no longer has a/x: gone once it completes.
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(O("b", "x", 3)));
        assert_eq!(cache.len(), 2);
        writer.apply(&watcher::Event::InitDone);
        assert!(cache.get("a", "x").is_none());
        assert_eq!(cache.state().len(), 1);
        assert_eq!(cache.get("b", "x").as_deref(), Some(&O("b", "x", 3)));
    }

    #[test]
    fn a_deletion_removes_the_object_and_its_namespace_when_empty() {
        let (cache, mut writer) = Cache::<O>::new();
        writer.apply(&watcher::Event::Apply(O("a", "x", 1)));
        writer.apply(&watcher::Event::Apply(O("a", "y", 1)));
        writer.apply(&watcher::Event::Delete(O("a", "x", 1)));
        assert!(cache.get("a", "x").is_none());
        assert!(cache.get("a", "y").is_some());
        writer.apply(&watcher::Event::Delete(O("a", "y", 1)));
        assert!(cache.is_empty());
        assert!(cache.map.read().unwrap().is_empty());
    }
}
