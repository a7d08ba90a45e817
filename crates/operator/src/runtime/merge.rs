//! Several namespaces watched as one. The apiserver lists and watches one namespace or all of
//! them, so an operator serving a few namespaces runs one watch per namespace; the caches, in
//! turn, take a relist as the whole truth (kube-runtime's store and ours swap in the listed
//! objects when a list completes). Passed through as they are, one namespace's relist would
//! empty the cache of every other.
//!
//! The merged stream therefore reads as one watch: one `Init`, the objects of every
//! namespace's first list, and one `InitDone` once every namespace has been listed. Later, a
//! relist of one namespace is told as the changes it found: an `Apply` for each object that
//! is new or has another resourceVersion, a `Delete` for each that is no longer listed, and
//! nothing for the unchanged ones. Its objects reach the caches, and its missed changes reach
//! the reconcilers, without a sweep of every lease. Such a `Delete` carries only the object's
//! name, UID and resourceVersion: the feeds take the rest from their caches
//! (`feeds::last_known`).

use std::collections::{HashMap, HashSet};

use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt, future};
use kube::Resource;
use kube::api::ObjectMeta;
use kube::runtime::watcher::{self, Event};

use super::skeleton::Skeleton;

type Item<K> = Result<Event<K>, watcher::Error>;

/// An object's UID and resourceVersion.
type Version = (Option<String>, Option<String>);

/// The watch of `namespaces` (all when empty) that `start` opens for one namespace, or for
/// all when given `None`: one watch for none or one namespace, a merged one for several.
pub fn each_namespace<K, S>(
    namespaces: &[String],
    start: impl Fn(Option<String>) -> S,
) -> BoxStream<'static, Item<K>>
where
    K: Resource + Skeleton + Send + 'static,
    S: Stream<Item = Item<K>> + Send + 'static,
{
    match namespaces {
        [] => start(None).boxed(),
        [one] => start(Some(one.clone())).boxed(),
        several => {
            let parts = several
                .iter()
                .enumerate()
                .map(|(i, ns)| start(Some(ns.clone())).map(move |item| (i, item)).boxed());
            let mut merge = Merge::new(several);
            let merged = stream::select_all(parts).flat_map(move |(i, item)| {
                stream::iter(match item {
                    Ok(event) => merge.step(i, event).into_iter().map(Ok).collect(),
                    Err(e) => vec![Err(e)],
                })
            });
            stream::once(future::ready(Ok(Event::Init)))
                .chain(merged)
                .boxed()
        }
    }
}

/// What the merged stream knows of one namespace's watch.
#[derive(Default)]
struct Part {
    namespace: String,
    /// Every object it has told of, by name: its UID and resourceVersion.
    known: HashMap<String, Version>,
    /// Names listed so far, while a (re)list is under way.
    listing: Option<HashSet<String>>,
    /// Its first list has completed.
    listed: bool,
}

/// The state of a merged watch: turns each namespace's events into those of one watch.
struct Merge<K> {
    parts: Vec<Part>,
    /// The one `InitDone` has been sent: from now on changes are told as `Apply` and `Delete`.
    synced: bool,
    /// Deletions seen before then, by namespace index and name: the caches buffer a list, and
    /// a deletion applied meanwhile would be undone by the buffer.
    deferred: HashMap<(usize, String), K>,
}

impl<K: Resource + Skeleton> Merge<K> {
    fn new(namespaces: &[String]) -> Self {
        let parts = namespaces
            .iter()
            .map(|ns| Part {
                namespace: ns.clone(),
                ..Default::default()
            })
            .collect();
        Merge {
            parts,
            synced: false,
            deferred: HashMap::new(),
        }
    }

    /// The events of the merged watch that event `event` of namespace `i` becomes.
    fn step(&mut self, i: usize, event: Event<K>) -> Vec<Event<K>> {
        match event {
            Event::Init => {
                self.parts[i].listing = Some(HashSet::new());
                vec![]
            }
            Event::InitApply(object) => {
                let name = name_of(&object);
                let part = &mut self.parts[i];
                if let Some(listing) = &mut part.listing {
                    listing.insert(name.clone());
                }
                let changed = part.known.get(&name) != Some(&version(&object));
                self.seen(i, name, &object);
                match (self.synced, changed) {
                    (false, _) => vec![Event::InitApply(object)],
                    (true, true) => vec![Event::Apply(object)],
                    (true, false) => vec![],
                }
            }
            Event::Apply(object) => {
                let name = name_of(&object);
                self.seen(i, name, &object);
                // Before the one InitDone, into the caches' buffer: applied to the cache
                // itself, the buffer would replace it.
                vec![if self.synced {
                    Event::Apply(object)
                } else {
                    Event::InitApply(object)
                }]
            }
            Event::Delete(object) => {
                let name = name_of(&object);
                self.parts[i].known.remove(&name);
                self.gone(i, name, object)
            }
            Event::InitDone => self.listed(i),
        }
    }

    fn seen(&mut self, i: usize, name: String, object: &K) {
        self.deferred.remove(&(i, name.clone()));
        self.parts[i].known.insert(name, version(object));
    }

    fn gone(&mut self, i: usize, name: String, object: K) -> Vec<Event<K>> {
        if self.synced {
            vec![Event::Delete(object)]
        } else {
            self.deferred.insert((i, name), object);
            vec![]
        }
    }

    /// Namespace `i`'s (re)list is done: what it no longer lists is deleted; once every
    /// namespace has been listed, the one `InitDone`, then the deletions held back.
    fn listed(&mut self, i: usize) -> Vec<Event<K>> {
        let part = &mut self.parts[i];
        let listing = part.listing.take().unwrap_or_default();
        part.listed = true;
        let missing: Vec<(String, Version)> = part
            .known
            .extract_if(|name, _| !listing.contains(name))
            .collect();
        let namespace = part.namespace.clone();
        let mut events = Vec::new();
        for (name, (uid, resource_version)) in missing {
            let metadata = ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                uid,
                resource_version,
                ..Default::default()
            };
            events.extend(self.gone(i, name, K::skeleton(metadata)));
        }
        if !self.synced && self.parts.iter().all(|p| p.listed) {
            self.synced = true;
            events.push(Event::InitDone);
            events.extend(self.deferred.drain().map(|(_, o)| Event::Delete(o)));
        }
        events
    }
}

fn name_of<K: Resource>(object: &K) -> String {
    object.meta().name.clone().unwrap_or_default()
}

fn version<K: Resource>(object: &K) -> Version {
    let meta = object.meta();
    (meta.uid.clone(), meta.resource_version.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fenced_lease_api::FencedLease;

    fn lease(ns: &str, name: &str, rv: &str) -> FencedLease {
        let metadata = ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            uid: Some(format!("uid-{ns}-{name}")),
            resource_version: Some(rv.into()),
            ..Default::default()
        };
        FencedLease::skeleton(metadata)
    }

    /// An event as `(kind, namespace/name@rv)`, to compare.
    fn show(events: &[Event<FencedLease>]) -> Vec<String> {
        let id = |l: &FencedLease| {
            let m = &l.metadata;
            format!(
                "{}/{}@{}",
                m.namespace.as_deref().unwrap_or(""),
                m.name.as_deref().unwrap_or(""),
                m.resource_version.as_deref().unwrap_or("")
            )
        };
        events
            .iter()
            .map(|e| match e {
                Event::Init => "Init".into(),
                Event::InitDone => "InitDone".into(),
                Event::InitApply(l) => format!("InitApply {}", id(l)),
                Event::Apply(l) => format!("Apply {}", id(l)),
                Event::Delete(l) => format!("Delete {}", id(l)),
            })
            .collect()
    }

    fn merge() -> Merge<FencedLease> {
        Merge::new(&["a".into(), "b".into()])
    }

    #[test]
    fn one_init_done_once_every_namespace_is_listed() {
        let mut m = merge();
        let mut out = vec![];
        out.extend(m.step(0, Event::Init));
        out.extend(m.step(0, Event::InitApply(lease("a", "x", "1"))));
        out.extend(m.step(0, Event::InitDone));
        out.extend(m.step(1, Event::Init));
        out.extend(m.step(1, Event::InitApply(lease("b", "y", "2"))));
        assert_eq!(show(&out), ["InitApply a/x@1", "InitApply b/y@2"]);
        assert_eq!(show(&m.step(1, Event::InitDone)), ["InitDone"]);
    }

    #[test]
    fn changes_of_a_listed_namespace_wait_in_the_buffer_until_all_are_listed() {
        let mut m = merge();
        m.step(0, Event::Init);
        m.step(0, Event::InitApply(lease("a", "x", "1")));
        m.step(0, Event::InitDone);
        // a keeps watching while b is still listing.
        assert_eq!(
            show(&m.step(0, Event::Apply(lease("a", "x", "2")))),
            ["InitApply a/x@2"]
        );
        assert!(m.step(0, Event::Delete(lease("a", "x", "3"))).is_empty());
        m.step(0, Event::Apply(lease("a", "z", "4")));
        m.step(0, Event::Delete(lease("a", "z", "5")));
        // Re-created under the same name: its deletion is no longer due.
        m.step(0, Event::Apply(lease("a", "z", "6")));
        m.step(1, Event::Init);
        let out = m.step(1, Event::InitDone);
        assert_eq!(show(&out), ["InitDone", "Delete a/x@3"]);
    }

    #[test]
    fn a_relist_of_one_namespace_tells_only_what_changed_and_empties_no_other() {
        let mut m = merge();
        for (i, ns) in [(0, "a"), (1, "b")] {
            m.step(i, Event::Init);
            m.step(i, Event::InitApply(lease(ns, "same", "1")));
            m.step(i, Event::InitApply(lease(ns, "changed", "1")));
            m.step(i, Event::InitApply(lease(ns, "gone", "1")));
            m.step(i, Event::InitDone);
        }
        let mut out = m.step(0, Event::Init);
        out.extend(m.step(0, Event::InitApply(lease("a", "same", "1"))));
        out.extend(m.step(0, Event::InitApply(lease("a", "changed", "7"))));
        out.extend(m.step(0, Event::InitApply(lease("a", "new", "8"))));
        out.extend(m.step(0, Event::InitDone));
        assert_eq!(
            show(&out),
            ["Apply a/changed@7", "Apply a/new@8", "Delete a/gone@1"]
        );
        // Watching again: changes as they come.
        assert_eq!(
            show(&m.step(1, Event::Delete(lease("b", "gone", "9")))),
            ["Delete b/gone@9"]
        );
        assert_eq!(
            show(&m.step(1, Event::Apply(lease("b", "same", "10")))),
            ["Apply b/same@10"]
        );
    }

    #[test]
    fn a_namespace_that_relists_before_the_others_are_listed_loses_what_it_no_longer_lists() {
        let mut m = merge();
        m.step(0, Event::Init);
        m.step(0, Event::InitApply(lease("a", "x", "1")));
        m.step(0, Event::InitApply(lease("a", "y", "1")));
        // The list broke off and started over; y was deleted meanwhile.
        m.step(0, Event::Init);
        m.step(0, Event::InitApply(lease("a", "x", "2")));
        assert!(m.step(0, Event::InitDone).is_empty());
        m.step(1, Event::Init);
        assert_eq!(
            show(&m.step(1, Event::InitDone)),
            ["InitDone", "Delete a/y@1"]
        );
    }

    #[tokio::test]
    async fn the_merged_stream_starts_with_one_init_and_passes_errors_on() {
        let a = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(lease("a", "x", "1"))),
            Ok(Event::InitDone),
        ];
        let b = vec![
            Ok(Event::Init),
            Err(watcher::Error::NoResourceVersion),
            Ok(Event::Init),
            Ok(Event::InitDone),
        ];
        let streams = HashMap::from([("a".to_string(), a), ("b".to_string(), b)]);
        let namespaces = ["a".to_string(), "b".to_string()];
        let merged: Vec<Item<FencedLease>> = each_namespace(&namespaces, |ns| {
            stream::iter(
                streams[&ns.unwrap()]
                    .iter()
                    .map(clone_item)
                    .collect::<Vec<_>>(),
            )
        })
        .collect()
        .await;
        let (oks, errors): (Vec<_>, Vec<_>) = merged.into_iter().partition(Result::is_ok);
        let oks: Vec<Event<FencedLease>> = oks.into_iter().map(Result::unwrap).collect();
        assert_eq!(show(&oks), ["Init", "InitApply a/x@1", "InitDone"]);
        assert_eq!(errors.len(), 1);
    }

    fn clone_item(item: &Item<FencedLease>) -> Item<FencedLease> {
        match item {
            Ok(e) => Ok(e.clone()),
            Err(_) => Err(watcher::Error::NoResourceVersion),
        }
    }
}
