//! `kubectl fence token LEASE`: the token a pod holds on a lease, read from the lease's status
//! (the grant itself), so a workload has it as soon as the operator grants it, where the pod's
//! `token.fencing.dev/<lease>` annotation reaches a downward-API file only when the kubelet
//! next refreshes the pod's volumes. With `--file`, written to a file (atomically: the whole
//! token or nothing); with `-w`, kept current until interrupted, as a sidecar would.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::commands::get_lease;
use super::{Failure, exit, failure};
use fenced_lease::api::FencedLease;

/// The pod whose token is asked for: its name, and its UID when known (a pod replaced under
/// the same name does not hold its predecessor's lease).
pub(super) struct Pod {
    pub name: String,
    pub uid: Option<String>,
}

/// Where the token goes.
pub(super) struct Output {
    pub file: Option<PathBuf>,
    pub watch: bool,
}

/// The token `pod` holds on `lease`, if it holds it.
fn held_by(lease: &FencedLease, pod: &Pod) -> Option<i64> {
    let status = lease.status.as_ref()?;
    let holder = status.holder.as_ref()?;
    let same_pod = holder.pod_name.as_deref() == Some(pod.name.as_str())
        && pod
            .uid
            .as_deref()
            .is_none_or(|uid| holder.pod_uid.as_deref() == Some(uid));
    same_pod.then_some(status.fencing_token)
}

/// Prints (or writes) the token; exits 75 when the pod does not hold the lease. With `watch`,
/// follows the lease and returns only on an error.
pub(super) async fn token(
    client: Client,
    namespace: &str,
    lease: &str,
    pod: &Pod,
    output: &Output,
    timeout: Option<Duration>,
) -> Result<u8, Failure> {
    let leases: Api<FencedLease> = Api::namespaced(client, namespace);
    let found = get_lease(&leases, lease, timeout).await?;
    let mut shown = held_by(&found, pod);
    show(shown, output)?;
    if !output.watch {
        return Ok(if shown.is_some() {
            exit::OK
        } else {
            exit::NOT_ACQUIRED
        });
    }
    let config = watcher::Config::default().fields(&format!("metadata.name={lease}"));
    let events = watcher(leases, config).default_backoff();
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        let now = match event {
            Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => held_by(&l, pod),
            Ok(watcher::Event::Delete(_)) => None,
            Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
            Err(e) => {
                eprintln!("kubectl fence: watching {lease}: {e} (retrying)");
                continue;
            }
        };
        if now != shown {
            shown = now;
            show(shown, output)?;
        }
    }
    Err(failure(format!("the watch of FencedLease {lease} ended")))
}

/// The token on stdout (a line; an empty line for none with -w), or as the file's whole
/// content (empty for none, as the downward API writes an absent annotation).
fn show(token: Option<i64>, output: &Output) -> Result<(), Failure> {
    let text = token.map(|t| t.to_string()).unwrap_or_default();
    match &output.file {
        Some(path) => write_atomically(path, &text)
            .map_err(|e| failure(format!("writing {}: {e}", path.display()))),
        None => {
            if token.is_some() || output.watch {
                println!("{text}");
            }
            Ok(())
        }
    }
}

/// Writes `text` beside `path`, then renames it over `path`: a reader sees the old token or
/// the new one, never a part of either.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("not a file name"))?;
    let mut temporary = name.to_os_string();
    temporary.push(".tmp");
    let temporary = path.with_file_name(temporary);
    std::fs::write(&temporary, text)?;
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fenced_lease::api::{FencedLeaseStatus, LeaseHolder};

    fn lease(pod: Option<(&str, &str)>, token: i64) -> FencedLease {
        let spec = serde_json::from_value(serde_json::json!({"leaseDurationSeconds": 15})).unwrap();
        let mut lease = FencedLease::new("l", spec);
        lease.status = Some(FencedLeaseStatus {
            holder: pod.map(|(name, uid)| LeaseHolder {
                pod_name: Some(name.into()),
                pod_uid: Some(uid.into()),
                ..LeaseHolder::default()
            }),
            fencing_token: token,
            ..FencedLeaseStatus::default()
        });
        lease
    }

    #[test]
    fn only_the_holding_pod_of_the_same_uid_gets_the_token() {
        let me = Pod {
            name: "web-0".into(),
            uid: Some("u1".into()),
        };
        let by_name = Pod {
            name: "web-0".into(),
            uid: None,
        };
        assert_eq!(held_by(&lease(Some(("web-0", "u1")), 7), &me), Some(7));
        assert_eq!(held_by(&lease(Some(("web-0", "u1")), 7), &by_name), Some(7));
        // A replacement of the same name is not the holder.
        assert_eq!(held_by(&lease(Some(("web-0", "u0")), 7), &me), None);
        assert_eq!(held_by(&lease(Some(("web-1", "u2")), 7), &me), None);
        assert_eq!(held_by(&lease(None, 7), &me), None);
    }

    #[test]
    fn the_file_holds_the_whole_token_or_nothing() {
        let dir = std::env::temp_dir().join(format!("fl-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        let output = Output {
            file: Some(path.clone()),
            watch: false,
        };
        show(Some(12), &output).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "12");
        show(None, &output).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        assert!(!dir.join("token.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
