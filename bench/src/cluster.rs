//! The cluster the programs measure: the kubeconfig's client, calls with a deadline, the
//! namespaces a run makes and removes, and objects created in bulk.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

use fenced_lease::api::FencedLease;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::{Res, fail};

/// The kubeconfig the programs use; children inherit KUBECONFIG.
pub async fn client() -> Res<Client> {
    if std::env::var_os("KUBECONFIG").is_none() {
        return fail("KUBECONFIG is not set: eval \"$(hack/control-plane up)\" first");
    }
    Ok(fenced_lease::client::infer().await?)
}

/// `fut` within `timeout`; its error or the timeout named by `what`.
pub async fn within<T, E: Display>(
    timeout: Duration,
    what: impl Display,
    fut: impl Future<Output = Result<T, E>>,
) -> Res<T> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => fail(format!("{what}: {e}")),
        Err(_) => fail(format!("{what}: no answer within {timeout:?}")),
    }
}

/// Is `e` the apiserver's answer with HTTP status `code`?
pub fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Creates namespace `name`.
pub async fn create_namespace(client: &Client, name: &str) -> Res<()> {
    let object: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &object)
        .await?;
    Ok(())
}

/// A fresh namespace `prefix-xxxxxx`.
pub async fn namespace(client: &Client, prefix: &str) -> Res<String> {
    let ns = format!("{prefix}-{:06x}", rand::random::<u32>() & 0xffffff);
    create_namespace(client, &ns).await?;
    Ok(ns)
}

/// Removes namespace `ns` with no operator left to run the finalizers ([`remove_namespaces`]).
pub async fn cleanup(client: &Client, ns: &str) {
    let (call, wait) = (Duration::from_secs(60), Duration::from_secs(300));
    remove_namespaces(client, &[ns.to_string()], call, wait).await;
}

/// Deletes `namespaces` (their leases' finalizers stripped first, should a lease be left with no
/// operator to finalize it) and waits up to `wait` until the namespace controller has removed
/// them; how many are still there. Every call gets `timeout`.
pub async fn remove_namespaces(
    client: &Client,
    namespaces: &[String],
    timeout: Duration,
    wait: Duration,
) -> usize {
    let api: Api<Namespace> = Api::all(client.clone());
    futures::stream::iter(namespaces)
        .for_each_concurrent(16, |ns| {
            let api = api.clone();
            async move {
                strip_finalizers(client, ns, timeout).await;
                let what = format!("delete namespace {ns}");
                let delete = DeleteParams::background();
                let _ = within(timeout, what, api.delete(ns, &delete)).await;
            }
        })
        .await;
    // Wait until they are gone: an operator of the next run watching all namespaces would
    // otherwise put its finalizer back on leases being deleted and finalize each of them.
    let deadline = Instant::now() + wait;
    loop {
        let mut left = 0;
        for ns in namespaces {
            let got = within(timeout, "get namespace", api.get_opt(ns)).await;
            left += usize::from(!matches!(got, Ok(None)));
        }
        if left == 0 || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Strips the finalizers of namespace `ns`'s leases, 32 at a time.
async fn strip_finalizers(client: &Client, ns: &str, timeout: Duration) {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default();
    let Ok(list) = within(timeout, "list leases", leases.list_metadata(&lp)).await else {
        return;
    };
    let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    futures::stream::iter(list.items.iter().filter(|m| !m.finalizers().is_empty()))
        .for_each_concurrent(32, |m| {
            let (leases, strip) = (&leases, &strip);
            async move {
                let (name, pp) = (m.name_any(), PatchParams::default());
                let _ = within(timeout, "strip", leases.patch(&name, &pp, strip)).await;
            }
        })
        .await;
}

/// Creates `objects` with `concurrency` requests in flight; returns how long it took.
pub async fn create_all<K>(api: &Api<K>, objects: Vec<K>, concurrency: usize) -> Res<Duration>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let started = Instant::now();
    futures::stream::iter(objects)
        .map(|o| async move {
            let pp = PostParams::default();
            match api.create(&pp, &o).await {
                Ok(_) => Ok(()),
                Err(e) if is_status(&e, 409) => Ok(()), // exists already
                Err(e) => Err(e),
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(started.elapsed())
}
