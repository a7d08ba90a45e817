//! Figures of a process and of this machine's TCP connections, from /proc: CPU time, resident
//! memory, file descriptors, connections to the apiserver by state, full accept queues.

use std::collections::BTreeMap;

/// Ticks of /proc/<pid>/stat's utime and stime per second (USER_HZ; 100 on Linux/x86_64).
const TICKS_PER_SECOND: f64 = 100.0;

/// A process's CPU time so far, in seconds (user + system).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at ") ".
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after ") ".
    (tick(11) + tick(12)) / TICKS_PER_SECOND
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Resident memory now (VmRSS), MiB.
pub fn rss_mib(pid: u32) -> f64 {
    status_kib(pid, "VmRSS:") as f64 / 1024.0
}

/// Peak resident memory (VmHWM), MiB.
pub fn peak_rss_mib(pid: u32) -> f64 {
    status_kib(pid, "VmHWM:") as f64 / 1024.0
}

/// Open file descriptors, and how many of them are sockets (connections).
pub fn fds(pid: u32) -> (usize, usize) {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return (0, 0);
    };
    let mut total = 0;
    let mut sockets = 0;
    for entry in dir.flatten() {
        total += 1;
        if std::fs::read_link(entry.path())
            .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
        {
            sockets += 1;
        }
    }
    (total, sockets)
}

/// Client TCP connections to `port` on this machine, by state (from /proc/net/tcp{,6}):
/// with thousands in SYN_SENT or TIME_WAIT, connecting is what a client waits on.
pub fn tcp_states(port: u16) -> BTreeMap<&'static str, usize> {
    let mut states = BTreeMap::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state)) = (fields.get(2), fields.get(3)) else {
                continue;
            };
            let remote_port = remote
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if remote_port != Some(port) {
                continue;
            }
            let name = match *state {
                "01" => "established",
                "02" => "syn-sent",
                "06" => "time-wait",
                "08" => "close-wait",
                _ => "other",
            };
            *states.entry(name).or_insert(0) += 1;
        }
    }
    states
}

/// The kernel's count of connections dropped because a listening socket's accept queue was
/// full (TcpExt ListenOverflows, this network namespace): SYNs dropped, retried a second or
/// more later, which a client with a short connect timeout reports as a connect error.
pub fn listen_overflows() -> u64 {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.chunks(2) {
        let [names, values] = pair else { continue };
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let value = names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == "ListenOverflows")
            .and_then(|(_, v)| v.parse().ok());
        return value.unwrap_or(0);
    }
    0
}

/// The apiserver's port, from the KUBECONFIG's server URL.
pub fn apiserver_port() -> u16 {
    let path = std::env::var("KUBECONFIG").unwrap_or_default();
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .and_then(|url| url.rsplit(':').next()?.trim_end_matches('/').parse().ok())
        .unwrap_or(0)
}
