//! API calls with the run's deadline (`--call-timeout`), and the counts the steps wait on.

use std::fmt::Display;
use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};

use crate::cluster::{is_status, within};
use crate::figures::ms;
use crate::{Res, fail};

/// Every API call's deadline (`--call-timeout`).
pub(super) static CALL_TIMEOUT: OnceLock<Duration> = OnceLock::new();

pub(super) fn call_timeout() -> Duration {
    *CALL_TIMEOUT.get().unwrap_or(&Duration::from_secs(60))
}

/// `fut` within the call deadline; its error or the timeout named by `what`.
pub(super) async fn call<T, E: Display>(
    what: impl Display,
    fut: impl Future<Output = Result<T, E>>,
) -> Res<T> {
    within(call_timeout(), what, fut).await
}

/// Runs `fut`, a write that must be accepted; its latency in ms.
pub(super) async fn timed<T, E: Display>(
    what: &str,
    fut: impl Future<Output = Result<T, E>>,
) -> Res<f64> {
    let started = Instant::now();
    call(what, fut).await?;
    Ok(ms(started.elapsed()))
}

/// Deletes `name`, a 404 counting as done.
pub(super) async fn delete_quietly<K>(api: &Api<K>, name: &str) -> Res<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match tokio::time::timeout(call_timeout(), api.delete(name, &DeleteParams::default())).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) if is_status(&e, 404) => Ok(()),
        Ok(Err(e)) => fail(format!("delete {name}: {e}")),
        Err(_) => fail(format!(
            "delete {name}: no answer within {:?}",
            call_timeout()
        )),
    }
}

/// Every object `api` lists (metadata only, in pages).
pub(super) async fn count<K>(api: &Api<K>, lp: &ListParams) -> Res<usize>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut total = 0;
    let mut continue_token: Option<String> = None;
    loop {
        let mut page_params = lp.clone().limit(1000);
        if let Some(c) = &continue_token {
            page_params = page_params.continue_token(c);
        }
        let page = call("list", api.list_metadata(&page_params)).await?;
        total += page.items.len();
        continue_token = page.metadata.continue_.filter(|c| !c.is_empty());
        if continue_token.is_none() {
            return Ok(total);
        }
    }
}

/// ValidatingAdmissionPolicies and their bindings in the cluster now.
pub(super) async fn admission_objects(client: &Client) -> Res<(usize, usize)> {
    let lp = ListParams::default();
    let policies = count(&Api::<ValidatingAdmissionPolicy>::all(client.clone()), &lp).await?;
    let bindings = count(
        &Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()),
        &lp,
    )
    .await?;
    Ok((policies, bindings))
}
