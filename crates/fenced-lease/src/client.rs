//! A [`kube::Client`] whose connections send at once and speak HTTP/2 ([`client`]).
//!
//! kube-rs's own client (`Client::try_from(config)`, `Client::try_default()`) differs from a Go
//! client, client-go included, in two ways that cost this project's paths time:
//! - It leaves Nagle's algorithm on (kube-rs/kube#2056): a request written in two pieces (its
//!   headers, then its body) holds the second until the apiserver acknowledges the first, and
//!   the apiserver delays that acknowledgement up to 40 ms while it waits for the rest of the
//!   request: a release, a grant's status write or a heartbeat then takes 45 ms instead of 3,
//!   about one request in three (bench/runs/2026-12-02-queue-and-nodelay).
//! - It speaks HTTP/1.1 only: every request or watch in flight needs a connection of its own,
//!   and each new one a TCP and TLS handshake. A holder opens its watches right after its claim
//!   is created, so an acquire paid for those handshakes while the operator granted it, and
//!   the operator held 35–43 connections. Over HTTP/2: 0.2–3.5 ms off an acquire of 10–14 ms,
//!   and 5 connections (bench/runs/2026-12-03-http2).
//!
//! This client sets `TCP_NODELAY` and offers HTTP/2 (ALPN `h2`, then `http/1.1`), so that every
//! request and watch of one client shares one connection, and otherwise builds what kube
//! builds: the kubeconfig's TLS (server name included), auth, extra headers, timeouts and kube's
//! retry of 429/503/504 when the config asks for it.
//!
//! One connection means one that has died without a word (an apiserver's host gone, a NAT or
//! load balancer that forgot it) would hold every request until something notices: a
//! request's own timeout does not close it, as it did over HTTP/1.1. So the client pings the
//! apiserver when a connection has received nothing for [`PING_INTERVAL`], and drops the
//! connection when the answer takes longer than [`PING_TIMEOUT`]; the next request opens a new
//! one. A silent connection is left at most 5 s after it last delivered anything. A holder with
//! the default 15 s lease (a renew every 5 s, its deadline 13.5 s after the last renew
//! accepted) renews on a new connection 5.1 s after its connection went silent
//! (`tests/timed/holder/outage.rs`); without the pings it lost the lease. client-go pings too, after
//! 30 s and with 15 s to answer: ours are shorter because a holder's lease can be a few seconds.
//! A lease shorter than about 6 s does not outlast a silent connection.

use std::time::Duration;

use hyper_rustls::{FixedServerNameResolver, HttpsConnectorBuilder};
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ConfigExt, RustlsTlsError};
use kube::{Client, Config};
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

/// How long an HTTP/2 connection may receive nothing before the client pings the apiserver.
pub const PING_INTERVAL: Duration = Duration::from_secs(2);
/// How long the client waits for a ping's answer before it drops the connection.
pub const PING_TIMEOUT: Duration = Duration::from_secs(3);

/// A client for `config` whose connections set `TCP_NODELAY` and speak HTTP/2 when the
/// apiserver does. A config that names a proxy gets kube's own client (its proxy support, with
/// Nagle's algorithm on and HTTP/1.1).
pub fn client(config: Config) -> Result<Client, kube::Error> {
    if config.proxy_url.is_some() {
        return Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let mut tls = HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = name
            .clone()
            .try_into()
            .map_err(|e| kube::Error::RustlsTls(RustlsTlsError::InvalidServerName(e)))?;
        tls = tls.with_server_name_resolver(FixedServerNameResolver::new(name));
    }
    let https = tls.enable_all_versions().wrap_connector(http);
    let mut connector = TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http_client: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .http2_keep_alive_interval(PING_INTERVAL)
            .http2_keep_alive_timeout(PING_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .build(connector);
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
