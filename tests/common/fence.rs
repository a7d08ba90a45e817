//! For the fence tests: the admission policies of deploy/admission/, and PostgreSQL and Redis
//! started by `hack/datastores` (or found through FL_POSTGRES_URL and FL_REDIS_URL).

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};

use super::{TestNamespace, control_plane, repo_root, run, wait_for};
use fenced_lease::api::{LEASE_LABEL, TOKEN_ANNOTATION};

/// Where the test datastores listen.
pub struct Datastores {
    /// A libpq connection string.
    pub postgres: String,
    /// A redis:// URL.
    pub redis: String,
}

fn reachable(url_port: Option<u16>) -> bool {
    url_port.is_some_and(|port| {
        std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_secs(1),
        )
        .is_ok()
    })
}

fn postgres_port(conninfo: &str) -> Option<u16> {
    conninfo
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("port="))?
        .parse()
        .ok()
}

fn redis_port(url: &str) -> Option<u16> {
    url.rsplit(':').next()?.trim_end_matches('/').parse().ok()
}

/// The datastores of this test run: those the environment names when they answer, else the
/// ones `hack/datastores up` starts (idempotent; `make test` stops them after the run).
pub fn datastores() -> &'static Datastores {
    static DS: OnceLock<Datastores> = OnceLock::new();
    DS.get_or_init(|| {
        if let (Ok(postgres), Ok(redis)) = (
            std::env::var("FL_POSTGRES_URL"),
            std::env::var("FL_REDIS_URL"),
        ) && reachable(postgres_port(&postgres))
            && reachable(redis_port(&redis))
        {
            return Datastores { postgres, redis };
        }
        let out = run(Command::new(repo_root().join("hack/datastores")).arg("up"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let value = |name: &str| {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .map(|v| v.trim_matches('\'').to_string())
                .unwrap_or_else(|| panic!("hack/datastores up printed no {name}: {stdout}"))
        };
        Datastores {
            postgres: value("FL_POSTGRES_URL"),
            redis: value("FL_REDIS_URL"),
        }
    })
}

/// Applies deploy/admission/ (the fence policies), once per test process: `hack/crds install`,
/// which skips the MutatingAdmissionPolicy where the apiserver does not serve it (before 1.36).
pub fn install_fence_policies() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| control_plane().install_crds());
}

/// A ConfigMap named `name`, labelled with `lease` and stamped with `token` (any string, so
/// that malformed tokens can be written too).
pub fn fenced_config_map(name: &str, lease: &str, token: &str, data: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(LEASE_LABEL.into(), lease.into())])),
            annotations: Some(BTreeMap::from([(TOKEN_ANNOTATION.into(), token.into())])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("data".into(), data.into())])),
        ..Default::default()
    }
}

impl TestNamespace {
    /// Installs the fence policies and waits until the apiserver enforces the per-object
    /// rule (policies reach admission through an informer).
    pub async fn with_fence_policies(&self) {
        install_fence_policies();
        let api = self.api::<ConfigMap>();
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        let probe = fenced_config_map("policy-probe", "probe", "not-a-token", "");
        wait_for(
            "the fence policies to be enforced",
            Duration::from_secs(30),
            || async { api.create(&dry_run, &probe).await.is_err().then_some(()) },
        )
        .await;
    }
}
