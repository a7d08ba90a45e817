//! Helm (built by hack/helm) against the test control plane, and the chart's rendered objects.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

use crate::common::{control_plane, repo_root};

pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/fenced-lease")
}

/// The helm binary, built (once, cached) by `hack/helm`.
fn helm_binary() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        let out = Command::new(repo_root().join("hack/helm"))
            .args(["path", "helm"])
            .output()
            .expect("run hack/helm");
        assert!(
            out.status.success(),
            "hack/helm path helm: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// `helm` with its own cache and config directories and no cluster, for `helm template`.
pub fn helm_offline() -> Command {
    let home = std::env::temp_dir().join("fenced-lease-chart-test-helm");
    let mut cmd = Command::new(helm_binary());
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env("KUBECONFIG", "/dev/null");
    cmd
}

/// `helm` with the admin kubeconfig of the test control plane (never another cluster).
pub fn helm() -> Command {
    let mut cmd = helm_offline();
    cmd.arg("--kubeconfig").arg(&control_plane().kubeconfig);
    cmd
}

/// Runs `cmd`; panics with its output unless it succeeds.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The documents of a multi-document YAML text; empty and comment-only documents dropped.
pub fn documents(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .unwrap_or_else(|e| panic!("cannot parse YAML ({e}):\n{yaml}"))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// `helm template` of the chart in a directory (the repository's, or a scratch copy), with
/// `--set` values; the rendered objects.
pub fn render_dir(chart: &Path, namespace: &str, set: &[&str]) -> Vec<Value> {
    let mut cmd = helm_offline();
    cmd.args(["template", "fenced-lease"])
        .arg(chart)
        .args(["--namespace", namespace]);
    for value in set {
        cmd.args(["--set", value]);
    }
    documents(&String::from_utf8_lossy(&run_ok(&mut cmd).stdout))
}

pub fn render(namespace: &str, set: &[&str]) -> Vec<Value> {
    render_dir(&chart_dir(), namespace, set)
}

/// The chart rendered with more arguments of `helm template` (`--api-versions`, say).
pub fn render_with(namespace: &str, args: &[&str]) -> Vec<Value> {
    let mut cmd = helm_offline();
    cmd.args(["template", "fenced-lease"])
        .arg(chart_dir())
        .args(["--namespace", namespace])
        .args(args);
    documents(&String::from_utf8_lossy(&run_ok(&mut cmd).stdout))
}

/// The one object of `kind` named `name` among `objects`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} among the chart's objects"))
}

/// A Helm release of the chart in a test namespace; uninstalled when dropped. Its objects are
/// named `fl-<random>-fenced-lease-...` so that cluster-scoped ones never collide with another test's.
pub struct Release {
    pub name: String,
    pub namespace: String,
    pub fullname: String,
}

impl Release {
    /// `helm install` with `--set` values; panics unless it succeeds.
    pub fn install(namespace: &str, set: &[&str]) -> Self {
        let release = Self::named(namespace);
        let out = release.try_install(set);
        assert!(
            out.status.success(),
            "helm install failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        release
    }

    /// A release that is not installed yet.
    pub fn named(namespace: &str) -> Self {
        let name = format!("fl-{:06x}", rand::random::<u32>() >> 8);
        // The chart prefixes its objects with the release name and the chart name.
        Self {
            fullname: format!("{name}-fenced-lease"),
            name,
            namespace: namespace.into(),
        }
    }

    /// `helm install`, whatever comes of it.
    pub fn try_install(&self, set: &[&str]) -> Output {
        self.try_install_with(&[], set)
    }

    /// `helm install` with more flags, whatever comes of it.
    pub fn try_install_with(&self, flags: &[&str], set: &[&str]) -> Output {
        self.try_install_chart(&chart_dir(), flags, set)
    }

    /// `helm install` of a chart directory or packaged chart (.tgz), whatever comes of it.
    pub fn try_install_chart(&self, chart: &Path, flags: &[&str], set: &[&str]) -> Output {
        let mut cmd = helm();
        cmd.args(["install", &self.name])
            .arg(chart)
            .args(["--namespace", &self.namespace])
            .args(flags);
        for value in set {
            cmd.args(["--set", value]);
        }
        cmd.output().expect("run helm install")
    }

    /// `helm upgrade --reuse-values` with more `--set` values.
    pub fn upgrade(&self, set: &[&str]) -> Output {
        let mut cmd = helm();
        cmd.args(["upgrade", &self.name]).arg(chart_dir()).args([
            "--namespace",
            &self.namespace,
            "--reuse-values",
        ]);
        for value in set {
            cmd.args(["--set", value]);
        }
        run_ok(&mut cmd)
    }

    /// The objects Helm installed for this release.
    pub fn manifest(&self) -> Vec<Value> {
        let out = run_ok(helm().args(["get", "manifest", &self.name, "-n", &self.namespace]));
        documents(&String::from_utf8_lossy(&out.stdout))
    }

    pub fn uninstall(&self) -> Output {
        run_ok(helm().args(["uninstall", &self.name, "-n", &self.namespace]))
    }

    /// Name of the release's object derived from deploy/'s `fenced-lease-<suffix>`.
    pub fn object(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.fullname)
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = helm()
            .args([
                "uninstall",
                &self.name,
                "-n",
                &self.namespace,
                "--ignore-not-found",
            ])
            .output();
    }
}
