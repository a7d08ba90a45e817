//! A [`kube::Client`] whose connections send at once ([`client`]).
//!
//! kube-rs's own client (`Client::try_from(config)`, `Client::try_default()`) leaves Nagle's
//! algorithm on (kube-rs/kube#2056): a request written in two pieces (its headers, then its
//! body) holds the second until the apiserver acknowledges the first, and the apiserver
//! delays that acknowledgement up to 40 ms while it waits for the rest of the request. On this
//! project's paths that is a release, a grant's status write or a heartbeat taking 45 ms
//! instead of 3, in about one request in three (bench/runs/2026-12-02-nodelay). Go clients,
//! client-go included, set `TCP_NODELAY` on every connection; this does the same, and
//! otherwise builds what kube builds: the kubeconfig's TLS, auth, extra headers, timeouts and
//! kube's retry of 429/503/504 when the config asks for it.

use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ConfigExt};
use kube::{Client, Config};
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

/// A client for `config` whose connections set `TCP_NODELAY`. A config that names a proxy
/// gets kube's own client (its proxy support, with Nagle's algorithm on).
pub fn client(config: Config) -> Result<Client, kube::Error> {
    if config.proxy_url.is_some() {
        return Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut connector = TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http_client: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new()).build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http_client);
    Ok(Client::new(service, config.default_namespace))
}

/// [`client`] for the config inferred as [`Client::try_default`] does (kubeconfig, then
/// in-cluster).
pub async fn infer() -> Result<Client, kube::Error> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    client(config)
}
