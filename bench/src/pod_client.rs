//! Acting as a pod no kubelet runs: a ServiceAccount token bound to the pod (the TokenRequest
//! API with the pod as its bound object), the token a kubelet mounts, so that the apiserver
//! sees the pod's name and UID in the writer's `userInfo.extra`. A Pending pod is all the
//! identity needs.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use kube::config::AuthInfo;
use kube::{Client, Config};
use serde_json::json;

use crate::Res;
use crate::cluster::within;

/// A pod to act as: its namespace, name and UID, and the ServiceAccount it runs as.
#[derive(Clone, Copy, Debug)]
pub struct PodRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub service_account: &'a str,
}

/// The kubeconfig's cluster, authenticated as `pod` with a token of an hour bound to it, asked
/// for by `client` within `timeout`. For a program that picks its own HTTP client; else
/// [`pod_client`].
pub async fn pod_config(client: &Client, pod: PodRef<'_>, timeout: Duration) -> Res<Config> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name.into()),
                uid: Some(pod.uid.into()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), pod.namespace);
    let pp = PostParams::default();
    let ask = accounts.create_subresource("token", pod.service_account, &pp, &request);
    let issued: TokenRequest = within(timeout, format!("token for pod {}", pod.name), ask).await?;
    let token = issued
        .status
        .and_then(|s| s.token)
        .ok_or("a TokenRequest without a token")?;
    let mut config = Config::infer().await?;
    config.auth_info = serde_json::from_value::<AuthInfo>(json!({ "token": token }))?;
    Ok(config)
}

/// A client acting as `pod` ([`pod_config`]), over the fenced-lease client's connections.
pub async fn pod_client(client: &Client, pod: PodRef<'_>, timeout: Duration) -> Res<Client> {
    let config = pod_config(client, pod, timeout).await?;
    Ok(fenced_lease::client::client(config)?)
}
