//! A loopback TCP proxy in front of the apiserver, for one client only, that can be cut (every
//! connection dropped, new ones refused) and healed: an apiserver outage as that client sees
//! it, while the operator and the test itself keep their own connections. It can also silence
//! the connections it has (a NAT or load balancer that forgot them, an apiserver host gone
//! without a word) while new ones go through. TLS passes through untouched (the apiserver's
//! certificate is for 127.0.0.1).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::config::Kubeconfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use super::TestNamespace;

pub struct Proxy {
    pub port: u16,
    upstream: u16,
    cut: Arc<AtomicBool>,
    /// Milliseconds a new connection waits before it is passed on.
    delay_ms: Arc<AtomicU64>,
    connections: Arc<Mutex<Vec<Connection>>>,
    /// Connections refused while cut.
    refused: Arc<AtomicU64>,
    /// Connections passed on to the apiserver.
    accepted: Arc<AtomicU64>,
    accept: AbortHandle,
}

impl Proxy {
    /// A proxy to the test control plane's apiserver.
    pub async fn start(ns: &TestNamespace) -> Self {
        let upstream = ns
            .client_config()
            .await
            .cluster_url
            .port_u16()
            .expect("apiserver port");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let cut = Arc::new(AtomicBool::new(false));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let connections: Arc<Mutex<Vec<Connection>>> = Arc::default();
        let refused = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let accept = tokio::spawn({
            let (cut, delay_ms, connections, refused, accepted) = (
                cut.clone(),
                delay_ms.clone(),
                connections.clone(),
                refused.clone(),
                accepted.clone(),
            );
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    if cut.load(Ordering::SeqCst) {
                        refused.fetch_add(1, Ordering::SeqCst);
                        drop(client);
                        continue;
                    }
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let delay = Duration::from_millis(delay_ms.load(Ordering::SeqCst));
                    let silent = Arc::new(AtomicBool::new(false));
                    let task = tokio::spawn({
                        let silent = silent.clone();
                        async move {
                            tokio::time::sleep(delay).await;
                            if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                                let (from_client, to_client) = client.into_split();
                                let (from_server, to_server) = server.into_split();
                                tokio::join!(
                                    relay(from_client, to_server, silent.clone()),
                                    relay(from_server, to_client, silent)
                                );
                            }
                        }
                    });
                    connections.lock().unwrap().push(Connection {
                        task: task.abort_handle(),
                        silent,
                    });
                }
            }
        })
        .abort_handle();
        Proxy {
            port,
            upstream,
            cut,
            delay_ms,
            connections,
            refused,
            accepted,
            accept,
        }
    }

    /// Connections refused while cut (to tell that a partition was really exercised).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }

    /// Connections passed on to the apiserver so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// New connections are passed on only after `delay` (a slow network).
    pub fn delay_new_connections(&self, delay: Duration) {
        self.delay_ms.store(
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// Drops every connection and refuses new ones, until [`heal`](Self::heal).
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for c in self.connections.lock().unwrap().drain(..) {
            c.task.abort();
        }
    }

    /// Every connection open now stays open but passes nothing on, either way, from now on;
    /// new connections go through.
    pub fn silence(&self) {
        for c in self.connections.lock().unwrap().iter() {
            c.silent.store(true, Ordering::SeqCst);
        }
    }

    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// An admin kubeconfig that goes through this proxy.
    pub fn kubeconfig(&self, ns: &TestNamespace, name: &str) -> PathBuf {
        self.rewrite(
            ns.admin_kubeconfig(),
            &std::env::temp_dir().join(format!("{}-{name}.kubeconfig", ns.name)),
        )
    }

    /// `kubeconfig` rewritten to go through this proxy, written to `dest`.
    pub fn rewrite(&self, kubeconfig: &Path, dest: &Path) -> PathBuf {
        let mut kc = Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
        for cluster in &mut kc.clusters {
            if let Some(c) = cluster.cluster.as_mut() {
                c.server = c
                    .server
                    .as_ref()
                    .map(|s| s.replace(&format!(":{}", self.upstream), &format!(":{}", self.port)));
            }
        }
        let yaml = serde_saphyr::to_string(&kc).expect("serialize kubeconfig");
        std::fs::write(dest, yaml).expect("write kubeconfig");
        dest.to_path_buf()
    }

    /// An admin client (no read timeout, as holders use) that goes through this proxy.
    pub async fn client(&self, ns: &TestNamespace) -> Client {
        super::client_from_kubeconfig(&self.kubeconfig(ns, &format!("proxy-{}", self.port))).await
    }
}

/// A connection passed on: its relay task, and whether it is silenced.
struct Connection {
    task: AbortHandle,
    /// Set: the connection stays open and passes nothing on, either way.
    silent: Arc<AtomicBool>,
}

/// Copies `from` to `to` until either ends; once `silent` is set, reads and drops what comes,
/// and keeps `to` open when `from` ends (a silent connection does not close either).
async fn relay(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, silent: Arc<AtomicBool>) {
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if silent.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    if silent.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let _ = to.shutdown().await;
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for c in self.connections.lock().unwrap().drain(..) {
            c.task.abort();
        }
    }
}
