//! The versions of objects this operator has itself written, by UID, until its caches catch
//! up. Two things follow from them:
//!
//! - A reconcile that finds the cache still at a version the operator has already replaced
//!   knows the cache lags its own write: deciding on that copy would repeat the write (a claim
//!   status applied twice, a lease status refused with 409 and read again). It waits for the
//!   write's watch event instead, and says so ([`OwnWrites::is_superseded`] marks the write
//!   awaited).
//! - The watch event of exactly such a write ([`OwnWrites::seen`] finds it among its own writes) shows
//!   nothing the writing reconcile did not know: it decided on what it had, and every change
//!   that came before the write has an event of its own. So that event triggers no reconcile,
//!   unless one is waiting for it. On a lease with a long queue each reconcile reads every
//!   claim; these would be most of a hand-over's work.
//!
//! Every write of an object the operator watches goes through [`OwnWrites::around`], which
//! keeps this record; nothing else writes it.
//!
//! Never used for safety: the lease status write keeps its `resourceVersion` precondition;
//! this only saves writes that would be refused or change nothing, and reconciles that would
//! find nothing to do.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use super::locked;

/// What a watch event asks for when it is news: sent then, or once a write in flight shows
/// the event was not its own after all.
pub type Trigger = Box<dyn FnOnce() + Send>;

/// Sends `trigger`, if there is one.
pub fn fire(trigger: Option<Trigger>) {
    if let Some(t) = trigger {
        t();
    }
}

/// One object's writes the caches have not shown yet.
#[derive(Default)]
struct Writes {
    /// Versions written over.
    over: Vec<String>,
    /// Versions written.
    wrote: Vec<String>,
    /// A reconcile found the cache at a version written over and waits for the event.
    awaited: bool,
    /// Writes sent whose answer has not come back.
    in_flight: u32,
    /// Events that came while a write was in flight, of a version not known yet: the write's
    /// own (its watch event can come before its answer), or news. Their triggers wait for
    /// the answer.
    parked: Vec<(String, Option<Trigger>)>,
}

/// Writes per object UID (a handful at most: one per write not yet seen).
#[derive(Default)]
pub struct OwnWrites {
    writes: Mutex<HashMap<String, Writes>>,
}

/// A write of this operator on its way: [`Flight::wrote`] with its answer; dropped without
/// one (a failure, a timeout), the events it held back are news.
struct Flight<'a> {
    writes: &'a OwnWrites,
    uid: String,
    landed: bool,
}

impl Flight<'_> {
    /// The write replaced version `before` with `after`.
    fn wrote(mut self, before: Option<&str>, after: Option<&str>) {
        self.landed = true;
        self.writes.land(&self.uid, before, after);
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        if !self.landed {
            self.writes.land(&self.uid, None, None);
        }
    }
}

impl OwnWrites {
    /// Sends `write`, of object `uid` read at version `before`, and records the version it
    /// leaves: the one way the operator writes an object it watches. Events of the object
    /// that come while it is on its way wait for its answer (they may be its own); without an
    /// answer they are news.
    pub async fn around<K: kube::Resource, E>(
        &self,
        uid: Option<&str>,
        before: Option<&str>,
        write: impl Future<Output = Result<K, E>>,
    ) -> Result<K, E> {
        let flight = self.writing(uid.unwrap_or_default());
        let written = write.await?;
        flight.wrote(before, written.meta().resource_version.as_deref());
        Ok(written)
    }

    /// A write of object `uid` is about to be sent.
    fn writing(&self, uid: &str) -> Flight<'_> {
        locked(&self.writes)
            .entry(uid.to_owned())
            .or_default()
            .in_flight += 1;
        Flight {
            writes: self,
            uid: uid.to_owned(),
            landed: false,
        }
    }

    /// Records that a write replaced version `before` of object `uid` with `after`. A write
    /// that changed nothing (the same version back) is not recorded: no event follows it.
    #[cfg(test)]
    fn wrote(&self, uid: &str, before: Option<&str>, after: Option<&str>) {
        record(&mut locked(&self.writes), uid, before, after);
    }

    /// A write in flight came back: recorded, and the events it held back are settled.
    fn land(&self, uid: &str, before: Option<&str>, after: Option<&str>) {
        let mut fire = vec![];
        {
            let mut writes = locked(&self.writes);
            let Some(w) = writes.get_mut(uid) else {
                return;
            };
            w.in_flight = w.in_flight.saturating_sub(1);
            let mut own_seen = false;
            for (version, trigger) in std::mem::take(&mut w.parked) {
                if after == Some(version.as_str()) {
                    own_seen = true; // this write's own event: nothing new
                } else if w.in_flight > 0 {
                    w.parked.push((version, trigger)); // maybe another write's
                } else {
                    fire.extend(trigger);
                }
            }
            // A write whose own event came is shown by the cache already: nothing to record.
            if !own_seen {
                record(&mut writes, uid, before, after);
            }
            if writes.get(uid).is_some_and(Writes::is_empty) {
                writes.remove(uid);
            }
        }
        fire.into_iter().for_each(|t| t());
    }

    /// Is version `version` of object `uid` one this operator has already written over? Then
    /// the caller waits for the write's event, which is marked awaited. A version it has not
    /// written over means the cache caught up: the record is dropped.
    pub fn is_superseded(&self, uid: Option<&str>, version: Option<&str>) -> bool {
        let (Some(uid), Some(version)) = (uid, version) else {
            return false;
        };
        let mut writes = locked(&self.writes);
        match writes.get_mut(uid) {
            Some(w) if w.over.iter().any(|v| v == version) => {
                w.awaited = true;
                true
            }
            Some(w) => {
                w.caught_up();
                if w.is_empty() {
                    writes.remove(uid);
                }
                false
            }
            None => false,
        }
    }

    /// The cache now holds version `version` of object `uid` (a watch event), which asks for
    /// `trigger`. The trigger is dropped when the event shows only this operator's own write
    /// and no reconcile waits for it; held back while a write of the object is in flight and
    /// the version is not known yet (the event may be that write's); sent otherwise. A version
    /// not written over means the cache caught up, and the record goes.
    pub fn seen(&self, uid: Option<&str>, version: Option<&str>, trigger: Option<Trigger>) {
        let (Some(uid), Some(version)) = (uid, version) else {
            return fire(trigger);
        };
        let send = {
            let mut writes = locked(&self.writes);
            match writes.get_mut(uid) {
                None => trigger,
                // An older version: someone else's change, or the creation.
                Some(w) if w.over.iter().any(|v| v == version) => trigger,
                Some(w) => {
                    let known = w.wrote.iter().any(|v| v == version);
                    let own = known && !w.awaited;
                    let send = if !known && w.in_flight > 0 {
                        w.parked.push((version.to_owned(), trigger));
                        None
                    } else if own {
                        None
                    } else {
                        trigger
                    };
                    w.caught_up();
                    if w.is_empty() {
                        writes.remove(uid);
                    }
                    send
                }
            }
        };
        fire(send);
    }

    /// Forgets object `uid` (deleted). Events held back for it are sent.
    pub fn forget(&self, uid: &str) {
        let gone = locked(&self.writes).remove(uid);
        for (_, trigger) in gone.map(|w| w.parked).unwrap_or_default() {
            fire(trigger);
        }
    }

    /// No object has a write the caches have not shown yet.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        locked(&self.writes).is_empty()
    }
}

impl Writes {
    /// The cache shows a version past every write recorded.
    fn caught_up(&mut self) {
        self.over.clear();
        self.wrote.clear();
        self.awaited = false;
    }

    fn is_empty(&self) -> bool {
        self.over.is_empty() && self.in_flight == 0 && self.parked.is_empty()
    }
}

fn record(
    writes: &mut HashMap<String, Writes>,
    uid: &str,
    before: Option<&str>,
    after: Option<&str>,
) {
    let (Some(before), Some(after)) = (before, after) else {
        return;
    };
    if before == after {
        return;
    }
    let w = writes.entry(uid.to_owned()).or_default();
    if !w.over.iter().any(|v| v == before) {
        w.over.push(before.to_owned());
    }
    w.wrote.push(after.to_owned());
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A trigger that counts into `fired`.
    fn counting(fired: &Arc<AtomicUsize>) -> Option<Trigger> {
        let fired = fired.clone();
        Some(Box::new(move || {
            fired.fetch_add(1, Ordering::SeqCst);
        }))
    }

    /// Whether the event of version `version` of `uid` triggers (at once).
    fn triggers(w: &OwnWrites, uid: &str, version: &str) -> bool {
        let fired = Arc::new(AtomicUsize::new(0));
        w.seen(Some(uid), Some(version), counting(&fired));
        fired.load(Ordering::SeqCst) == 1
    }

    #[test]
    fn a_version_written_over_is_stale_until_the_cache_shows_another() {
        let w = OwnWrites::default();
        w.wrote("a", Some("1"), Some("2"));
        w.wrote("a", Some("2"), Some("3"));
        assert!(w.is_superseded(Some("a"), Some("1")));
        assert!(w.is_superseded(Some("a"), Some("2")));
        assert!(
            !w.is_superseded(Some("a"), Some("3")),
            "the cache caught up"
        );
        assert!(w.is_empty(), "and the record is gone");
        assert!(
            !w.is_superseded(Some("a"), Some("1")),
            "an old copy after that is not ours to judge"
        );
    }

    #[test]
    fn a_write_that_changed_nothing_is_not_recorded() {
        let w = OwnWrites::default();
        w.wrote("a", Some("5"), Some("5"));
        assert!(!w.is_superseded(Some("a"), Some("5")));
        w.wrote("b", None, Some("5"));
        assert!(w.is_empty());
    }

    #[test]
    fn a_watch_event_of_a_newer_version_drops_the_record() {
        let w = OwnWrites::default();
        w.wrote("a", Some("1"), Some("2"));
        w.seen(Some("a"), Some("1"), None);
        assert!(!w.is_empty(), "the event of the version written over");
        w.seen(Some("a"), Some("2"), None);
        assert!(w.is_empty());
    }

    #[test]
    fn the_event_of_an_own_write_triggers_only_when_awaited() {
        let w = OwnWrites::default();
        w.wrote("a", Some("1"), Some("2"));
        assert!(!triggers(&w, "a", "2"), "our own write");
        assert!(w.is_empty());

        w.wrote("a", Some("2"), Some("3"));
        assert!(w.is_superseded(Some("a"), Some("2")), "a reconcile waits");
        assert!(triggers(&w, "a", "3"), "the reconcile waiting for it");

        w.wrote("a", Some("3"), Some("4"));
        assert!(triggers(&w, "a", "5"), "someone else wrote after us");
        assert!(triggers(&w, "b", "1"), "never written");
    }

    #[test]
    fn a_write_over_a_version_written_before_triggers_until_the_last() {
        let w = OwnWrites::default();
        w.wrote("a", Some("1"), Some("2"));
        w.wrote("a", Some("2"), Some("3"));
        assert!(triggers(&w, "a", "2"), "written over since");
        assert!(!triggers(&w, "a", "3"));
    }

    #[test]
    fn an_event_ahead_of_its_writes_answer_waits_for_it() {
        let w = OwnWrites::default();
        let fired = Arc::new(AtomicUsize::new(0));
        let flight = w.writing("a");
        w.seen(Some("a"), Some("2"), counting(&fired));
        assert_eq!(fired.load(Ordering::SeqCst), 0, "held back");
        flight.wrote(Some("1"), Some("2"));
        assert_eq!(fired.load(Ordering::SeqCst), 0, "it was our own write");
        assert!(w.is_empty(), "and the cache already shows it");

        let flight = w.writing("a");
        w.seen(Some("a"), Some("3"), counting(&fired));
        flight.wrote(Some("2"), Some("4"));
        assert_eq!(
            fired.load(Ordering::SeqCst),
            1,
            "someone else's, before ours"
        );
        assert!(w.is_superseded(Some("a"), Some("2")), "ours not seen yet");

        let flight = w.writing("b");
        w.seen(Some("b"), Some("7"), counting(&fired));
        drop(flight); // failed: whatever came is news
        assert_eq!(fired.load(Ordering::SeqCst), 2);
        assert!(w.is_empty() || !w.is_superseded(Some("b"), Some("7")));
    }

    #[test]
    fn forgotten_objects_are_not_stale_and_release_what_they_held() {
        let w = OwnWrites::default();
        w.wrote("a", Some("1"), Some("2"));
        w.forget("a");
        assert!(!w.is_superseded(Some("a"), Some("1")));

        let fired = Arc::new(AtomicUsize::new(0));
        let flight = w.writing("b");
        w.seen(Some("b"), Some("2"), counting(&fired));
        w.forget("b");
        assert_eq!(fired.load(Ordering::SeqCst), 1);
        flight.wrote(Some("1"), Some("2"));
    }

    /// A ConfigMap at version `rv`: what a write answers with.
    fn at(rv: &str) -> k8s_openapi::api::core::v1::ConfigMap {
        let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
        cm.metadata.resource_version = Some(rv.into());
        cm
    }

    #[tokio::test]
    async fn a_write_sent_around_knows_its_own_event_whenever_it_comes() {
        let w = OwnWrites::default();
        let fired = Arc::new(AtomicUsize::new(0));
        // Its event comes before its answer: held back, then known as its own.
        let written = w
            .around(Some("a"), Some("1"), async {
                w.seen(Some("a"), Some("2"), counting(&fired));
                Ok::<_, ()>(at("2"))
            })
            .await;
        assert_eq!(
            written.map(|cm| cm.metadata.resource_version),
            Ok(Some("2".into()))
        );
        assert_eq!(
            fired.load(Ordering::SeqCst),
            0,
            "its own write: nothing new"
        );
        assert!(w.is_empty(), "the cache already shows it");

        // Its event comes after its answer: known as its own too.
        w.around(Some("a"), Some("2"), async { Ok::<_, ()>(at("3")) })
            .await
            .unwrap();
        assert!(
            w.is_superseded(Some("a"), Some("2")),
            "the cache lags the write"
        );
        assert!(
            triggers(&w, "a", "3"),
            "awaited by the reconcile that found it lagging"
        );

        // A write that fails: the event it held back was news.
        let failed = w
            .around(Some("b"), Some("1"), async {
                w.seen(Some("b"), Some("2"), counting(&fired));
                Err::<k8s_openapi::api::core::v1::ConfigMap, _>("timeout")
            })
            .await;
        assert!(failed.is_err());
        assert_eq!(
            fired.load(Ordering::SeqCst),
            1,
            "sent once the write failed"
        );
    }
}
