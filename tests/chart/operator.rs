//! fenced-lease-operator started exactly as the chart's Deployment starts it (its args and
//! environment, the downward API filled in), on this machine, with a given kubeconfig.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common::{http_get, wait_for};

pub struct ChartOperator {
    child: Child,
    pub log: PathBuf,
}

impl ChartOperator {
    /// Starts the container of `deployment` as pod `pod_name` in `namespace`, authenticating
    /// with `kubeconfig`. Only the metrics address moves to a free loopback port.
    pub fn start(deployment: &Value, namespace: &str, pod_name: &str, kubeconfig: &Path) -> Self {
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let args: Vec<String> = container["args"]
            .as_array()
            .expect("container args")
            .iter()
            .map(|a| a.as_str().expect("string arg").to_string())
            .map(|a| {
                if a.starts_with("--metrics-addr=") {
                    "--metrics-addr=127.0.0.1:0".into()
                } else {
                    a
                }
            })
            .collect();
        let log = std::env::temp_dir().join(format!("{namespace}-{pod_name}.log"));
        let mut cmd = Command::new(common::bin("fenced-lease-operator"));
        cmd.args(&args)
            .env_clear()
            .env("KUBECONFIG", kubeconfig)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        for var in container["env"].as_array().into_iter().flatten() {
            let name = var["name"].as_str().expect("env name");
            let value = match (&var["value"], &var["valueFrom"]["fieldRef"]["fieldPath"]) {
                (Value::String(v), _) => v.clone(),
                (_, Value::String(path)) if path == "metadata.namespace" => namespace.into(),
                (_, Value::String(path)) if path == "metadata.name" => pod_name.into(),
                _ => panic!("the test does not know how to fill in env {var}"),
            };
            cmd.env(name, value);
        }
        let file = std::fs::File::create(&log).expect("operator log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start fenced-lease-operator");
        Self { child, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the paths of the Deployment's probes answer 200.
    pub async fn wait_probes_pass(&self, deployment: &Value) {
        let port = wait_for(
            "the operator to serve HTTP",
            Duration::from_secs(30),
            || async {
                self.log_text()
                    .lines()
                    .filter(|l| l.contains("serving /livez"))
                    .filter_map(|l| l.split("\"addr\":\"127.0.0.1:").nth(1))
                    .filter_map(|rest| rest.split('"').next()?.parse::<u16>().ok())
                    .next_back()
            },
        )
        .await;
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        for probe in ["livenessProbe", "readinessProbe"] {
            let path = container[probe]["httpGet"]["path"]
                .as_str()
                .unwrap_or_else(|| panic!("{probe} has no httpGet path"));
            wait_for(
                &format!("{probe} {path} to answer 200"),
                Duration::from_secs(30),
                || async { (http_get(port, path).await?.0 == 200).then_some(()) },
            )
            .await;
        }
    }
}

impl Drop for ChartOperator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "---- operator log ({}) ----\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}
