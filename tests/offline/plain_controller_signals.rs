//! The unmodified-controller example (examples/plain_controller.sh) stops on SIGTERM wherever
//! in its loop the signal lands, and writes its last status: `kubectl fence run` sends SIGTERM
//! to its process group when the lease is lost, and a controller that misses it writes on until
//! SIGKILL, never saying it stopped (seen in CI: bash 5.2 printed `trap: line 2: unexpected EOF
//! while looking for matching `)'` and wrote on). Here kubectl is `true`, which answers at once,
//! and the round's pause is taken out, so that the signal lands in the writes as often as
//! possible: the script's signal handling is what is tested, not kubectl
//! (tests/cluster/fence/plain_controller.rs runs the script against an apiserver).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// How many times the controller is started and signalled, by how many threads at once.
const RUNS: u64 = 80;
const AT_ONCE: u64 = 8;
/// How long a signalled controller may take to write its last status and exit.
const STOP_WITHIN: Duration = Duration::from_secs(10);

/// A folder with the example, its pause taken out, and a `kubectl` that accepts every write
/// (`true`, which ignores its arguments).
fn setup() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("plain-controller-signals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = std::fs::read_to_string(common::repo_root().join("examples/plain_controller.sh"))
        .expect("the example");
    let pause = "  sleep 0.2 &\n  wait $! # a signal ends the wait at once\n";
    assert!(script.contains(pause), "the example's pause moved");
    write_executable(&dir.join("plain_controller.sh"), &script.replace(pause, ""));
    let truth = ["/bin/true", "/usr/bin/true"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("true(1)");
    std::os::unix::fs::symlink(truth, dir.join("kubectl")).unwrap();
    dir
}

fn write_executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The controller in a process group of its own, as `kubectl fence run` starts it, its
/// output in `log`.
fn start(dir: &Path, log: &Path) -> Child {
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new("bash")
        .arg(dir.join("plain_controller.sh"))
        .env("PATH", path)
        .env("POD_NAME", "r1")
        .env("TMPDIR", dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(log).unwrap())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("bash")
}

/// Waits up to `within` for `child` to exit; kills its group if it does not.
fn exited_within(child: &mut Child, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
    let _ = child.wait();
    false
}

/// Starts the controller, sends its group SIGTERM `after` its first write started (before, the
/// trap may not be set yet), and says what went wrong, if anything: it did not stop, or
/// stopped without writing its last status.
fn stop_once(dir: &Path, log: &Path, after: Duration) -> Option<String> {
    let mut child = start(dir, log);
    let deadline = Instant::now() + STOP_WITHIN;
    while std::fs::metadata(log).map_or(0, |m| m.len()) == 0 {
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            exited_within(&mut child, Duration::ZERO);
            return Some("no write started".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(after);
    killpg(Pid::from_raw(child.id() as i32), Signal::SIGTERM).expect("signal the group");
    if !exited_within(&mut child, STOP_WITHIN) {
        return Some(format!("still writing {STOP_WITHIN:?} after SIGTERM"));
    }
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(log).unwrap();
    let last = text.lines().last().unwrap_or_default();
    (!(status.success() && last.ends_with("accepted (last status)")))
        .then(|| format!("{status} and last line {last:?}"))
}

/// Bash 5.2 delimits a `$(...)` by running its parser again as it expands it, and runs a
/// pending trap from inside that parser: a signal arriving then makes the trap's text a syntax
/// error (`trap: line 2: unexpected EOF while looking for matching `)'`), the trap never runs,
/// and the loop goes on. The window is microseconds wide (2 runs of 200 of the old loop, run
/// with no pause, here; once in CI), too rare for a test to meet it reliably, so the rule is
/// checked on the text: once the trap is set, nothing is a command substitution.
#[test]
fn the_example_controller_expands_no_command_substitution_once_its_trap_is_set() {
    let script = std::fs::read_to_string(common::repo_root().join("examples/plain_controller.sh"))
        .expect("the example");
    let after_trap = script
        .split_once("trap 'stopping=1' TERM INT")
        .expect("the example's trap")
        .1;
    let substitutions: Vec<&str> = after_trap
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter(|l| l.contains('`') || l.replace("$((", "").contains("$("))
        .collect();
    assert!(
        substitutions.is_empty(),
        "a SIGTERM arriving as bash 5.2 expands these can be lost, and the controller then \
         writes on until SIGKILL:\n{}",
        substitutions.join("\n")
    );
}

#[test]
fn the_example_controller_stops_and_writes_its_last_status_wherever_sigterm_lands() {
    let dir = setup();
    let failures: Vec<String> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..AT_ONCE)
            .map(|t| {
                let (dir, log) = (&dir, dir.join(format!("log-{t}")));
                s.spawn(move || {
                    (t..RUNS)
                        .step_by(AT_ONCE as usize)
                        .filter_map(|run| {
                            // Different points of the loop: 0 to 29 ms into it.
                            let after = Duration::from_millis(run * 7 % 30);
                            stop_once(dir, &log, after).map(|e| format!("run {run}: {e}"))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        failures.is_empty(),
        "{} of {RUNS} runs did not stop with a last status:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
