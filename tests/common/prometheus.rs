//! A real Prometheus server (`hack/promtool server-path`: Debian's, or built from the Go module
//! proxy) on a free loopback port, scraping the test control plane's kube-apiserver (with the
//! admin client certificate, as a cluster's Prometheus scrapes it with its own credentials)
//! and, when given, an operator's `/metrics`, evaluating a rule file; read through its HTTP API.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube::config::Kubeconfig;
use serde_json::{Value, json};

use super::{control_plane, http_get, repo_root, run, wait_for};

/// How often it scrapes and evaluates: the apiserver's /metrics is a few MB, and these
/// machines have 2 shared cores.
pub const INTERVAL: Duration = Duration::from_secs(2);

pub struct Prometheus {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

/// The apiserver's address and the files of the admin identity, from the kubeconfig
/// `hack/control-plane` writes: (host:port, CA, client certificate, client key).
fn apiserver_target() -> (String, String, String, String) {
    let kc = Kubeconfig::read_from(&control_plane().kubeconfig).expect("kubeconfig");
    let cluster = kc.clusters[0].cluster.as_ref().expect("cluster");
    let user = kc.auth_infos[0].auth_info.as_ref().expect("user");
    let server = cluster.server.as_deref().expect("server");
    (
        server.trim_start_matches("https://").to_string(),
        cluster.certificate_authority.clone().expect("CA file"),
        user.client_certificate
            .clone()
            .expect("client certificate file"),
        user.client_key.clone().expect("client key file"),
    )
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

impl Prometheus {
    /// Starts a server in a scratch directory named after `name`, with the rule groups
    /// `groups` (a rule file's `groups`), scraping the apiserver as job `apiserver` and
    /// `operator_port` (if any) as job `fenced-lease-operator` with `honor_labels`, as the
    /// chart's ServiceMonitor does. Returns once both targets are up.
    pub async fn start(name: &str, groups: &Value, operator_port: Option<u16>) -> Self {
        let dir = std::env::temp_dir().join(format!("prometheus-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("prometheus directory");
        let (apiserver, ca, cert, key) = apiserver_target();
        let mut scrape = vec![json!({
            "job_name": "apiserver",
            "scheme": "https",
            "tls_config": {"ca_file": ca, "cert_file": cert, "key_file": key},
            "static_configs": [{"targets": [apiserver]}],
        })];
        if let Some(port) = operator_port {
            scrape.push(json!({
                "job_name": "fenced-lease-operator",
                "honor_labels": true,
                "static_configs": [{"targets": [format!("127.0.0.1:{port}")]}],
            }));
        }
        let interval = format!("{}s", INTERVAL.as_secs());
        // YAML is a superset of JSON: both files are written as JSON.
        let config = json!({
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [dir.join("rules.yaml")],
            "scrape_configs": scrape,
        });
        std::fs::write(
            dir.join("rules.yaml"),
            json!({"groups": groups}).to_string(),
        )
        .expect("rule file");
        std::fs::write(dir.join("prometheus.yml"), config.to_string()).expect("config");
        let binary = run(Command::new(repo_root().join("hack/promtool")).arg("server-path"));
        let binary = String::from_utf8_lossy(&binary.stdout).trim().to_string();
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
        let child = Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let prometheus = Self { child, port, dir };
        let targets = 1 + usize::from(operator_port.is_some());
        wait_for(
            "Prometheus to scrape its targets",
            Duration::from_secs(60),
            || async {
                let up = prometheus.query("up == 1").await?;
                (up.as_array()?.len() == targets).then_some(())
            },
        )
        .await;
        prometheus
    }

    /// `GET path` of its API: the `data` of a success.
    pub async fn api(&self, path: &str) -> Option<Value> {
        let (code, body) = http_get(self.port, path).await?;
        let answer: Value = serde_json::from_str(&body).ok()?;
        (code == 200 && answer["status"] == "success").then(|| answer["data"].clone())
    }

    /// An instant query: its result vector.
    pub async fn query(&self, promql: &str) -> Option<Value> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(promql)))
            .await?;
        Some(data["result"].clone())
    }

    /// Whether `promql` has a series labelled `label="value"` whose value is not 0 now.
    pub async fn shows(&self, promql: &str, label: &str, value: &str) -> bool {
        let result = self.query(promql).await.expect("the query");
        let series = result.as_array().cloned().unwrap_or_default();
        series
            .iter()
            .any(|s| s["metric"][label] == value && s["value"][1] != "0")
    }

    /// The alerts it holds now (pending or firing), as its alerts API lists them.
    pub async fn alerts(&self) -> Vec<Value> {
        let data = self.api("/api/v1/alerts").await.unwrap_or_default();
        data["alerts"].as_array().cloned().unwrap_or_default()
    }

    /// Its log, for a failure message.
    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
