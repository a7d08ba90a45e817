//! `kubectl fence` as a user runs it, and the processes it starts, for the holder-side CLI
//! tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{TestNamespace, wait_for};

/// `kubectl-fence --kubeconfig <admin> -n <namespace>`.
pub fn fence(ns: &TestNamespace) -> Command {
    fence_as(ns, ns.admin_kubeconfig())
}

/// `kubectl-fence --kubeconfig <kubeconfig> -n <namespace>`.
pub fn fence_as(ns: &TestNamespace, kubeconfig: &Path) -> Command {
    let mut cmd = Command::new(crate::bin("kubectl-fence"));
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["-n", &ns.name]);
    cmd
}

/// A file path private to this test.
pub fn scratch(ns: &TestNamespace, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(&ns.name);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(name)
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

pub async fn wait_until_file_has(path: &Path, text: &str, within: Duration) {
    wait_for(
        &format!("{} to contain {text:?}", path.display()),
        within,
        || async { read(path).contains(text).then_some(()) },
    )
    .await;
}

/// Waits for `child` to exit; panics after `within`.
pub async fn wait_exit(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("kubectl fence still running after {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn kill(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{sig} {pid}");
}

/// Sends `sig` to every process of group `pgid`.
pub fn kill_group(pgid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), "--", &format!("-{pgid}")])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{sig} -- -{pgid}");
}

/// The state letter of process `pid` (`R`, `S`, `T` stopped, `Z` zombie), if it exists.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ...: comm may contain spaces and parentheses.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// Whether process `pid` exists and has not ended (a zombie has ended).
pub fn alive(pid: u32) -> bool {
    process_state(pid).is_some_and(|s| s != 'Z' && s != 'X')
}

/// Waits until process `pid` is in state `state` (e.g. 'T'), or has ended (`None`).
pub async fn wait_state(pid: u32, state: Option<char>, within: Duration) {
    wait_for(
        &format!("process {pid} in state {state:?}"),
        within,
        || async {
            let now = process_state(pid).filter(|s| *s != 'Z' && *s != 'X');
            let matches = match state {
                Some('S') => matches!(now, Some('S' | 'R' | 'D')),
                other => now == other,
            };
            matches.then_some(())
        },
    )
    .await;
}

/// The PID a command wrote to `path` (`echo $$ > path`).
pub async fn pid_from(path: &Path) -> u32 {
    wait_until_file_has(path, "\n", Duration::from_secs(30)).await;
    read(path).trim().parse().expect("pid")
}

/// stdout and stderr of an output, for messages.
pub fn both(out: &std::process::Output) -> String {
    format!(
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Spawns with stderr captured to a file (read it with [`read`]), stdout null.
pub fn spawn_logged(mut cmd: Command, log: &Path) -> Child {
    let file = std::fs::File::create(log).expect("log file");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("spawn kubectl fence")
}
