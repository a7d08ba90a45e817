//! The watch of coordination Leases (`coordination.k8s.io/v1`), which FencedLeases may follow
//! (`spec.follow`): fills the cache and the index of the pods their holders name, and
//! reconciles the FencedLeases that follow a Lease whose holder changed. A renewal changes
//! nothing the operator keeps, and reconciles nothing. The nodes' heartbeats
//! (`kube-node-lease`) are not watched.

use futures::{Stream, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::{Memory, Triggers, index_event, last_known, reconcile};
use crate::context::Kube;
use crate::names::LeaseKey;
use crate::runtime::merge;
use crate::state::cache::{Cache, Writer, map_event};
use crate::state::followed::CachedLease;
use crate::state::own_writes::fire;

/// The namespace of the nodes' heartbeat Leases: never followed, never watched.
const NODE_LEASES: &str = "kube-node-lease";

/// The Lease watch of `namespaces` (all when empty, but the nodes'), feeding `memory` through
/// `writer`.
pub fn feed(
    kube: &Kube,
    namespaces: &[String],
    memory: &Memory,
    mut writer: Writer<CachedLease>,
    triggers: &Triggers,
) -> impl Stream<Item = Result<watcher::Event<CachedLease>, watcher::Error>> + Send + use<> {
    let client = kube.client.clone();
    let (memory, triggers) = (memory.clone(), triggers.clone());
    let cached = memory.followed.clone();
    merge::each_namespace(namespaces, move |namespace| {
        let (api, config): (Api<Lease>, _) = match namespace {
            Some(ns) => (
                Api::namespaced(client.clone(), &ns),
                watcher::Config::default(),
            ),
            None => (
                Api::all(client.clone()),
                watcher::Config::default().fields(&format!("metadata.namespace!={NODE_LEASES}")),
            ),
        };
        watcher(api, config).default_backoff()
    })
    .map_ok(|event| map_event(event, CachedLease::from_lease))
    .map_ok(move |event| last_known(&cached, event, |l| Some(l.uid.as_str())))
    .inspect_ok(move |event| {
        let changed = changed_holder(&memory.followed, event);
        writer.apply(event);
        index_event(
            &memory.followed_by_pod,
            || memory.followed.state(),
            event,
            CachedLease::holder_pods,
        );
        let leases = match (event, changed) {
            // A (re)list: every lease that follows a Lease (not every lease: a sweep).
            (watcher::Event::InitDone, _) => all_followers(&memory),
            (_, Some(lease)) => followers(&memory, lease),
            _ => return,
        };
        fire(reconcile(&triggers, leases));
    })
}

/// The Lease of an event that changes who holds it (a new holder, a new count of
/// transitions, a new object, a deletion): the cache showed it otherwise before the event.
fn changed_holder<'e>(
    cache: &Cache<CachedLease>,
    event: &'e watcher::Event<CachedLease>,
) -> Option<&'e CachedLease> {
    match event {
        watcher::Event::Apply(lease) => {
            let before = cache.get(&lease.namespace, &lease.name);
            (before.as_deref() != Some(lease)).then_some(lease)
        }
        watcher::Event::Delete(lease) => Some(lease),
        // A (re)list: its end reconciles every lease that follows one.
        watcher::Event::InitApply(_) | watcher::Event::Init | watcher::Event::InitDone => None,
    }
}

/// Every FencedLease that follows a Lease.
fn all_followers(memory: &Memory) -> Vec<LeaseKey> {
    let state = memory.leases.state();
    let following = state.iter().filter(|l| l.spec.follow.is_some());
    following.map(|l| LeaseKey::of(l)).collect()
}

/// The FencedLeases that follow `lease`.
pub fn followers(memory: &Memory, lease: &CachedLease) -> Vec<LeaseKey> {
    let ns = lease.namespace.as_str();
    memory
        .followers
        .get(ns, &lease.name)
        .into_iter()
        .map(|name| LeaseKey::new(ns, &name))
        .collect()
}
