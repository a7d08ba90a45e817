//! The control plane every test of a process shares: the one `KUBECONFIG` points at when
//! `hack/control-plane` made it, else one it starts; and clients of it.

use super::*;

/// The control plane shared by all tests of this process.
pub struct ControlPlane {
    pub kubeconfig: PathBuf,
    pub kubectl: PathBuf,
}

fn control_plane_script() -> Command {
    Command::new(repo_root().join("hack/control-plane"))
}

/// Is `kubeconfig` a running control plane made by `hack/control-plane`? Anything else (a
/// developer's real cluster, say) is never used by the tests.
fn is_running_test_cluster(kubectl: &Path, kubeconfig: &Path) -> bool {
    let name = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].name}",
        ])
        .output();
    let is_ours = matches!(name, Ok(out) if out.status.success() && out.stdout == TEST_CLUSTER_NAME.as_bytes());
    is_ours
        && Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--request-timeout=5s", "get", "--raw", "/readyz"])
            .output()
            .is_ok_and(|out| out.status.success())
}

/// Starts (or finds) the control plane and installs the CRDs, once per test process.
pub fn control_plane() -> &'static ControlPlane {
    static CP: OnceLock<ControlPlane> = OnceLock::new();
    CP.get_or_init(|| {
        let bin_dir = run(control_plane_script().arg("bin-dir")).stdout;
        let kubectl = PathBuf::from(String::from_utf8_lossy(&bin_dir).trim()).join("kubectl");
        let reusable = std::env::var_os("KUBECONFIG")
            .map(PathBuf::from)
            .filter(|kc| kubectl.exists() && is_running_test_cluster(&kubectl, kc));
        let kubeconfig = match reusable {
            Some(kc) => kc,
            None => {
                let out = run(control_plane_script().arg("up"));
                let stdout = String::from_utf8_lossy(&out.stdout);
                let last = stdout.lines().last().unwrap_or_default();
                let path = last.strip_prefix("export KUBECONFIG=").unwrap_or_else(|| {
                    panic!("unexpected output of hack/control-plane up: {stdout}")
                });
                PathBuf::from(path)
            }
        };
        let cp = ControlPlane {
            kubeconfig,
            kubectl,
        };
        cp.install_crds();
        cp
    })
}

impl ControlPlane {
    /// `kubectl apply -f crds/` and the admission policies of `deploy/admission/`, exactly as
    /// a user installs them, and waits until both kinds can be created (`hack/crds install`:
    /// `Established` is not enough while admission has not yet seen the claim's schema).
    pub fn install_crds(&self) {
        run(&mut self.install_crds_command());
    }

    /// The `hack/crds install` that [`Self::install_crds`] runs, for callers that must not
    /// panic when it fails.
    pub fn install_crds_command(&self) -> Command {
        let mut cmd = Command::new(repo_root().join("hack/crds"));
        cmd.arg("install")
            .env("KUBECTL", &self.kubectl)
            .env("KUBECONFIG", &self.kubeconfig);
        cmd
    }

    /// `hack/control-plane restart` of this control plane: etcd and the apiserver stopped and
    /// started again in place (same ports, same data), so every watch relists. Returns once
    /// the script does, with its output, whatever came of it.
    pub fn restart_command(&self) -> Command {
        // The runtime directory is the kubeconfig's.
        let run_dir = self.kubeconfig.parent().expect("runtime dir").to_path_buf();
        let mut cmd = control_plane_script();
        cmd.arg("restart").env("FL_CP_DIR", run_dir);
        cmd
    }

    /// `kubectl` with the admin kubeconfig.
    pub fn kubectl_cmd(&self) -> Command {
        let mut cmd = Command::new(&self.kubectl);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--request-timeout=30s");
        cmd
    }

    /// Client config of the cluster admin.
    pub async fn admin_config(&self) -> Config {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).expect("read kubeconfig");
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig");
        config.read_timeout = Some(API_TIMEOUT);
        config.write_timeout = Some(API_TIMEOUT);
        config.connect_timeout = Some(Duration::from_secs(5));
        config
    }
}

/// A client from a kubeconfig file (a ServiceAccount's, say); no read timeout, since
/// holders keep watches open.
pub async fn client_from_kubeconfig(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    config.read_timeout = None;
    fenced_lease::client::client(config).expect("client")
}
