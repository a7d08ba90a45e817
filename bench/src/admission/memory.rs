//! Step 2: the kube-apiserver's resident memory (VmRSS, and etcd's), right then and again
//! after a deliberate settle of `--settle` seconds.

use std::time::Duration;

use super::Bench;
use crate::Res;

impl Bench {
    /// The apiserver's (and etcd's) RSS now and after the settle.
    pub(super) async fn memory(&mut self, n: usize, label: &str, when: &str) -> Res<()> {
        let (pid, rss, etcd) = self.control_plane.rss()?;
        let (what, settled_what) = match when {
            "in place" => (
                "apiserver RSS, leases in place",
                "apiserver RSS, leases in place, settled",
            ),
            _ => (
                "apiserver RSS, leases deleted",
                "apiserver RSS, leases deleted, settled",
            ),
        };
        if when == "in place" {
            self.out.value(
                label,
                what,
                rss,
                "MiB",
                &format!(
                    "kube-apiserver pid {pid} VmRSS {}; etcd {etcd:.0} MiB",
                    if n > 0 {
                        "right after all leases were Held"
                    } else {
                        "with no lease"
                    }
                ),
            );
        }
        // A deliberate pause, not a wait on a condition: the apiserver's heap and informers
        // come to rest before the reading that counts.
        tokio::time::sleep(Duration::from_secs(self.args.settle)).await;
        let (pid, settled, etcd) = self.control_plane.rss()?;
        self.out.value(
            label,
            settled_what,
            settled,
            "MiB",
            &format!(
                "kube-apiserver pid {pid} VmRSS {} s after {}; etcd {etcd:.0} MiB",
                self.args.settle,
                if when == "in place" {
                    if n > 0 {
                        "all leases were Held"
                    } else {
                        "the previous reading"
                    }
                } else {
                    "the leases and their admission objects were gone"
                }
            ),
        );
        Ok(())
    }
}
