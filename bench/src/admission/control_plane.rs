//! The control plane's processes, by their pid files under `$FL_CP_DIR`: the apiserver's and
//! etcd's resident memory.

use std::path::{Path, PathBuf};

use super::Args;
use crate::procfs::rss_mib;
use crate::{Res, fail};

fn control_plane_dir() -> PathBuf {
    match std::env::var_os("FL_CP_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let tmp = std::env::var_os("TMPDIR").unwrap_or_else(|| "/tmp".into());
            // hack/control-plane's `id -u`: the owner of this process's /proc entry.
            use std::os::unix::fs::MetadataExt;
            let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
            PathBuf::from(tmp).join(format!("fenced-lease-control-plane-{uid}"))
        }
    }
}

/// The pid in `file`, if it names a running process.
fn pid_in(file: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
}

pub(super) struct ControlPlane {
    apiserver_pid_file: PathBuf,
    etcd_pid_file: PathBuf,
}

impl ControlPlane {
    pub(super) fn new(args: &Args) -> Self {
        let dir = control_plane_dir();
        ControlPlane {
            apiserver_pid_file: args
                .apiserver_pid_file
                .clone()
                .unwrap_or_else(|| dir.join("kube-apiserver.pid")),
            etcd_pid_file: dir.join("etcd.pid"),
        }
    }

    /// The apiserver's and etcd's VmRSS now, MiB (the pid files are read every time: a
    /// restart changes the pid).
    pub(super) fn rss(&self) -> Res<(u32, f64, f64)> {
        let Some(pid) = pid_in(&self.apiserver_pid_file) else {
            return fail(format!(
                "no running kube-apiserver in {} (FL_CP_DIR, or --apiserver-pid-file)",
                self.apiserver_pid_file.display()
            ));
        };
        let etcd = pid_in(&self.etcd_pid_file).map_or(f64::NAN, rss_mib);
        Ok((pid, rss_mib(pid), etcd))
    }
}
