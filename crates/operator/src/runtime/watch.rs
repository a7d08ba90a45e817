//! Watches that one unreadable object cannot stop. A typed watch fails its whole list when a
//! single object does not decode (say, one stored under an older schema), and the operator
//! would then stand still for every lease (I8). These watches read objects untyped, decode
//! them one by one, and report and skip the ones that do not decode.

use std::fmt::Debug;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt, future};
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::merge;
use super::skeleton::Skeleton;

/// Watches `K` in `namespaces` (all when empty) with the default backoff; objects that do
/// not decode are passed to `unreadable` and left out (a deleted one still leaves the cache).
pub fn watch<K>(
    client: Client,
    namespaces: &[String],
    config: watcher::Config,
    unreadable: impl Fn(&DynamicObject, &serde_json::Error) + Clone + Send + 'static,
) -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Skeleton + Clone + Debug + Send + 'static,
{
    merge::each_namespace(namespaces, |namespace| {
        watch_one(
            client.clone(),
            namespace,
            config.clone(),
            unreadable.clone(),
        )
    })
}

/// [`watch`] of one namespace (all when `None`).
fn watch_one<K>(
    client: Client,
    namespace: Option<String>,
    config: watcher::Config,
    unreadable: impl Fn(&DynamicObject, &serde_json::Error) + Send + 'static,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Skeleton + Clone + Debug + Send + 'static,
{
    let resource = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client, &ns, &resource),
        None => Api::all_with(client, &resource),
    };
    watcher(api, config)
        .default_backoff()
        .filter_map(move |item| {
            future::ready(match item {
                Ok(event) => decode_event(event, &unreadable).map(Ok),
                Err(e) => Some(Err(e)),
            })
        })
}

/// The typed event, or `None` when its object does not decode (except a deletion).
pub fn decode_event<K>(
    event: watcher::Event<DynamicObject>,
    unreadable: &impl Fn(&DynamicObject, &serde_json::Error),
) -> Option<watcher::Event<K>>
where
    K: DeserializeOwned + Skeleton,
{
    // The object's parts are moved into the typed one, not copied: a copy of every listed
    // object, freed right away, leaves holes in the heap. managedFields are never read, and
    // the largest part of most objects: dropped first.
    let decode = |object: DynamicObject| -> Option<K> {
        let DynamicObject {
            types,
            mut metadata,
            data,
        } = object;
        metadata.managed_fields = None;
        // Who it is, for the report should it not decode.
        let identity = DynamicObject {
            types: types.clone(),
            metadata: ObjectMeta {
                name: metadata.name.clone(),
                namespace: metadata.namespace.clone(),
                uid: metadata.uid.clone(),
                ..Default::default()
            },
            data: serde_json::Value::Null,
        };
        let whole = match data {
            serde_json::Value::Object(mut fields) => serde_json::to_value(metadata).map(|meta| {
                fields.insert("metadata".into(), meta);
                if let Some(types) = types {
                    fields.insert("apiVersion".into(), types.api_version.into());
                    fields.insert("kind".into(), types.kind.into());
                }
                serde_json::Value::Object(fields)
            }),
            other => serde_json::to_value(DynamicObject {
                types,
                metadata,
                data: other,
            }),
        };
        whole
            .and_then(serde_json::from_value)
            .map_err(|e| unreadable(&identity, &e))
            .ok()
    };
    Some(match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(decode(o)?),
        watcher::Event::InitApply(o) => watcher::Event::InitApply(decode(o)?),
        watcher::Event::Delete(o) => {
            let metadata = o.metadata.clone();
            watcher::Event::Delete(decode(o).unwrap_or_else(|| K::skeleton(metadata)))
        }
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    })
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use serde_json::json;

    use super::*;
    use fenced_lease_api::FencedLease;

    fn object(spec: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
            "metadata": {"name": "l", "namespace": "ns"}, "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn readable_objects_pass_and_unreadable_ones_are_reported_and_skipped() {
        let reported = Cell::new(0);
        let count = |_: &DynamicObject, _: &serde_json::Error| reported.set(reported.get() + 1);
        let good = decode_event::<FencedLease>(
            watcher::Event::Apply(object(json!({"leaseDurationSeconds": 5}))),
            &count,
        );
        assert!(
            matches!(good, Some(watcher::Event::Apply(l)) if l.spec.lease_duration_seconds == 5)
        );
        let bad = decode_event::<FencedLease>(
            watcher::Event::InitApply(object(json!({"leaseDurationSeconds": "soon"}))),
            &count,
        );
        assert!(bad.is_none());
        assert_eq!(reported.get(), 1);
    }

    #[test]
    fn an_unreadable_object_that_is_deleted_still_leaves_the_cache() {
        let ignore = |_: &DynamicObject, _: &serde_json::Error| {};
        let gone = decode_event::<FencedLease>(
            watcher::Event::Delete(object(json!({"leaseDurationSeconds": "soon"}))),
            &ignore,
        );
        assert!(
            matches!(gone, Some(watcher::Event::Delete(l)) if l.metadata.name.as_deref() == Some("l"))
        );
    }
}
