//! What one cached claim and one cached pod cost in heap, so that a change that makes them
//! dearer shows here rather than in a 20-minute benchmark: 10,000 each are cached at the
//! issue-11 scale, where the operator must stay within 64 MiB. Counted by a counting
//! allocator in glibc's chunk sizes (request + 8 bytes, rounded up to 16, at least 32), over
//! 10,000 granted claims decoded as the watch decodes them, and 10,000 pods, each with its
//! cache's key. Before the compact caches: 1,948 B a claim (as a `FencedLeaseClaim` in
//! kube-runtime's store), 652 B a pod; after: 1,081 B and 489 B.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};

use fenced_lease::api::FencedLeaseClaim;
use fenced_lease_operator::runtime::watch::decode_event;
use fenced_lease_operator::state::CachedClaim;
use fenced_lease_operator::state::CachedPod;
use fenced_lease_operator::state::cache::{Cache, map_event};
use kube::api::DynamicObject;
use kube::runtime::watcher::Event;

const N: usize = 10_000;
/// Budgets, with room over what was measured (1,081 and 489 B).
const CLAIM_BYTES: isize = 1_250;
const POD_BYTES: isize = 560;

/// Counts live heap bytes as glibc's malloc hands them out.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

fn chunk(layout: Layout) -> isize {
    let size = (layout.size() + 8).div_ceil(16) * 16;
    isize::try_from(size.max(32)).unwrap_or(isize::MAX)
}

// SAFETY: every call is passed on to the system allocator unchanged; only a counter is kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(chunk(layout), Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(chunk(layout), Relaxed);
        // SAFETY: `ptr` was allocated by `System` with this layout (in `alloc` above).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A granted claim of a pod, as the apiserver sends it (managedFields aside).
fn claim(i: usize) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
        "metadata": {
            "name": format!("claim-{i:05}"), "namespace": "bench-ns",
            "uid": "0f8fad5b-d9cb-469f-a165-70867728950e", "resourceVersion": "1234567",
            "generation": 9, "creationTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": format!("pod-{i:05}"),
                                 "uid": "1f8fad5b-d9cb-469f-a165-70867728950e"}]
        },
        "spec": {"leaseName": format!("lease-{i:05}"), "holderIdentity": format!("pod-{i:05}"),
                 "podName": format!("pod-{i:05}"), "renewTime": "2026-01-01T00:00:01.000000Z"},
        "status": {
            "phase": "Granted", "fencingToken": 3, "leaseDurationSeconds": 15,
            "grantTime": "2026-01-01T00:00:02.000000Z",
            "message": format!("holds lease lease-{i:05} with fencing token 3"),
            "conditions": [
                {"type": "LeaseFound", "status": "True", "reason": "Found", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:02Z"},
                {"type": "PodFound", "status": "True", "reason": "Found", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:02Z"}
            ]
        }
    }))
    .expect("claim object")
}

fn pod(i: usize) -> CachedPod {
    CachedPod {
        name: format!("pod-{i:05}"),
        namespace: "bench-ns".into(),
        uid: Some("1f8fad5b-d9cb-469f-a165-70867728950e".into()),
        resource_version: Some("1234567".into()),
        tokens: vec![(format!("lease-{i:05}"), "3".into())],
    }
}

/// Heap bytes per object that `fill` leaves behind.
fn per_object<T>(fill: impl FnOnce() -> T) -> (isize, T) {
    let before = LIVE.load(Relaxed);
    let kept = fill();
    ((LIVE.load(Relaxed) - before) / N as isize, kept)
}

// One test: the counter sees every thread of the process.
#[test]
fn a_cached_claim_and_a_cached_pod_stay_within_their_heap_budgets() {
    let ignore = |_: &DynamicObject, _: &serde_json::Error| {};
    let (claim_bytes, claims) = per_object(|| {
        let (cache, mut writer) = Cache::<CachedClaim>::new();
        for i in 0..N {
            let event = decode_event::<FencedLeaseClaim>(Event::Apply(claim(i)), &ignore)
                .expect("a readable claim");
            writer.apply(&map_event(event, CachedClaim::from));
        }
        (cache, writer)
    });
    let (pod_bytes, pods) = per_object(|| {
        let (cache, mut writer) = Cache::<CachedPod>::new();
        for i in 0..N {
            writer.apply(&Event::Apply(pod(i)));
        }
        (cache, writer)
    });
    assert_eq!((claims.0.len(), pods.0.len()), (N, N), "all cached");
    eprintln!("a cached claim: {claim_bytes} B; a cached pod: {pod_bytes} B");
    assert!(
        claim_bytes <= CLAIM_BYTES,
        "a cached claim takes {claim_bytes} B of heap, over its budget of {CLAIM_BYTES}"
    );
    assert!(
        pod_bytes <= POD_BYTES,
        "a cached pod takes {pod_bytes} B of heap, over its budget of {POD_BYTES}"
    );
}
