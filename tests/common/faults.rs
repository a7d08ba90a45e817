//! Fault injection for tests: a loopback TCP proxy in front of the apiserver that a test can
//! cut (every connection through it dropped, new ones refused) and heal, so that one process
//! alone — the operator, or one holder — is partitioned from the control plane while every
//! other client still reaches it; and kubeconfigs that send a client through such a proxy.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A loopback TCP proxy to one upstream address. Dropped: it stops.
pub struct Proxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped on every cut: connections opened before it close themselves.
    generation: watch::Sender<u64>,
    refused: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let cut = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(AtomicU64::new(0));
        let (generation, _) = watch::channel(0u64);
        let task = tokio::spawn({
            let (cut, refused, generation) = (cut.clone(), refused.clone(), generation.clone());
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    if cut.load(Ordering::SeqCst) {
                        refused.fetch_add(1, Ordering::SeqCst);
                        drop(client); // accepted and closed at once: the peer sees a reset
                        continue;
                    }
                    let mut cuts = generation.subscribe();
                    tokio::spawn(async move {
                        let Ok(server) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let (mut client, mut server) = (client, server);
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = cuts.changed() => {} // cut: both ends dropped
                        }
                    });
                }
            }
        });
        Proxy {
            addr,
            cut,
            generation,
            refused,
            task,
        }
    }

    /// Drops every connection through the proxy and refuses new ones until [`heal`](Self::heal).
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Connections refused while cut (to tell that the partition was really exercised).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

/// The apiserver address a kubeconfig written by `hack/control-plane` points at.
pub fn apiserver_addr(kubeconfig: &Path) -> SocketAddr {
    let text = std::fs::read_to_string(kubeconfig).expect("read kubeconfig");
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .expect("a server line in the kubeconfig")
        .trim()
        .trim_start_matches("https://")
        .trim_end_matches('/');
    server.parse().expect("the server is ip:port")
}

/// A copy of `kubeconfig` whose server is `proxy` (same certificates: the apiserver's serving
/// certificate is for 127.0.0.1, whatever the port).
pub fn kubeconfig_through(kubeconfig: &Path, proxy: &Proxy) -> PathBuf {
    let text = std::fs::read_to_string(kubeconfig).expect("read kubeconfig");
    let upstream = apiserver_addr(kubeconfig);
    let rewritten = text.replace(
        &format!("https://{upstream}"),
        &format!("https://{}", proxy.addr),
    );
    assert_ne!(
        rewritten, text,
        "the kubeconfig names its server as https://ip:port"
    );
    let path = std::env::temp_dir().join(format!(
        "kubeconfig-proxy-{}-{:08x}",
        proxy.addr.port(),
        rand::random::<u32>()
    ));
    std::fs::write(&path, rewritten).expect("write kubeconfig");
    path
}
