//! The recorded history: every process of a run (holders, writers, the observer, the nemesis)
//! appends one JSON line per event to its own file, stamped with CLOCK_MONOTONIC in
//! nanoseconds. All processes share one machine, so the stamps of different processes are
//! comparable; the checker merges the files.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Nanoseconds on CLOCK_MONOTONIC: the same clock in every process of the machine
/// (`std::time::Instant` reads it too, but does not expose its value).
pub fn now() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always readable");
    u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(ts.tv_nsec()).unwrap_or(0)
}

/// One recorded event: when (`t`, CLOCK_MONOTONIC ns), by which process (`p`), what.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub t: u64,
    pub p: String,
    #[serde(flatten)]
    pub ev: Event,
}

/// The fenced resources every holder writes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Resource {
    /// A ConfigMap labelled with the lease, checked by the admission policies.
    Kube,
    /// A PostgreSQL row (`fence_token <= $t`).
    Postgres,
    /// A Redis key (the Lua script).
    Redis,
    /// A workload object of the kind the lease fences by kind (`spec.fence`): its status,
    /// scale, metadata, deletion and creation, written unstamped, so that only the writer's
    /// pod identity fences them (I11).
    Workload,
    /// An object no lease fences (I12): ConfigMaps and Secrets outside every lease's label,
    /// kinds and selector, written by the collateral writer as cluster-admin and as a pod
    /// that holds nothing; and, while a lease is gone, what it fenced. Any refusal of such a
    /// write is collateral (see the checker's `collateral`).
    Unfenced,
}

impl Resource {
    pub const ALL: [Resource; 4] = [
        Resource::Kube,
        Resource::Postgres,
        Resource::Redis,
        Resource::Workload,
    ];

    pub fn describe(self) -> &'static str {
        match self {
            Resource::Kube => "Kubernetes object",
            Resource::Postgres => "PostgreSQL row",
            Resource::Redis => "Redis key",
            Resource::Workload => "workload fenced by kind",
            Resource::Unfenced => "object no lease fences",
        }
    }

    /// Does the resource order writes by their token? (A workload's writes carry none.)
    pub fn checks_tokens(self) -> bool {
        !matches!(self, Resource::Workload | Resource::Unfenced)
    }

    /// Does the apiserver fence the writes by the writer's pod (I11)?
    pub fn fenced_by_identity(self) -> bool {
        matches!(self, Resource::Kube | Resource::Workload)
    }
}

/// One accepted write in a resource's own log, in the order the resource applied them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Position in the resource's order (log id, list index, resourceVersion).
    pub seq: u64,
    pub token: i64,
    /// The write's id, as the writer recorded it.
    pub write: String,
}

/// The kinds of fault the nemesis injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    PauseHolder,
    KillHolder,
    PartitionHolder,
    KillOperatorMidGrant,
    PauseOperator,
    PartitionOperator,
    KillLeader,
    RestartApiserver,
    RestartEtcd,
    RecreateLease,
    DeleteTokenRecords,
    LowerDuration,
    /// A lease deleted with its finalizer stripped (`metadata.finalizers: null`, then
    /// delete), and created again.
    StripFinalizer,
    /// A lease's fence edited to something invalid (refused at admission), and to something
    /// valid the operator may not manage to put in place; then its own fence put back.
    InvalidFence,
}

impl FaultKind {
    pub const ALL: [FaultKind; 14] = [
        FaultKind::PauseHolder,
        FaultKind::KillHolder,
        FaultKind::PartitionHolder,
        FaultKind::KillOperatorMidGrant,
        FaultKind::PauseOperator,
        FaultKind::PartitionOperator,
        FaultKind::KillLeader,
        FaultKind::RestartApiserver,
        FaultKind::RestartEtcd,
        FaultKind::RecreateLease,
        FaultKind::DeleteTokenRecords,
        FaultKind::LowerDuration,
        FaultKind::StripFinalizer,
        FaultKind::InvalidFence,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::PauseHolder => "pause-holder",
            FaultKind::KillHolder => "kill-holder",
            FaultKind::PartitionHolder => "partition-holder",
            FaultKind::KillOperatorMidGrant => "kill-operator-mid-grant",
            FaultKind::PauseOperator => "pause-operator",
            FaultKind::PartitionOperator => "partition-operator",
            FaultKind::KillLeader => "kill-leader",
            FaultKind::RestartApiserver => "restart-apiserver",
            FaultKind::RestartEtcd => "restart-etcd",
            FaultKind::RecreateLease => "recreate-lease",
            FaultKind::DeleteTokenRecords => "delete-token-records",
            FaultKind::LowerDuration => "lower-duration",
            FaultKind::StripFinalizer => "strip-finalizer",
            FaultKind::InvalidFence => "invalid-fence",
        }
    }

    /// Does the fault delete a lease (and create it again)? Its holders then lose it by the
    /// administrator's act, and what it fenced is fenced by no one for a while.
    pub fn deletes_lease(self) -> bool {
        matches!(
            self,
            FaultKind::RecreateLease | FaultKind::DeleteTokenRecords | FaultKind::StripFinalizer
        )
    }
}

/// The holder a fault was aimed at, as the lease status named it when the fault began.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub process: String,
    pub lease: String,
    pub claim: String,
    pub token: i64,
    /// The running term's duration (seconds).
    pub term: i32,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "kebab-case")]
pub enum Event {
    // ---- library holders ----
    /// `acquire` was called: the process queues a claim and waits.
    Waiting {
        lease: String,
    },
    /// `acquire` failed (timeout, lease deleted, API unavailable).
    AcquireFailed {
        lease: String,
        error: String,
    },
    /// `acquire` returned a guard granted `token` (recorded right after it returned).
    Acquired {
        lease: String,
        claim: String,
        token: i64,
    },
    /// `token()` answered Ok; it was called at `called` (ns) and returned at the entry's `t`.
    TokenOk {
        lease: String,
        claim: String,
        token: i64,
        called: u64,
    },
    /// `token()` answered Err.
    TokenErr {
        lease: String,
        claim: String,
        called: u64,
        reason: String,
    },
    /// `lost()` resolved. `deadline_in`: how far ahead the holder's own safe deadline still
    /// was at that instant (ns; negative when it had passed).
    Lost {
        lease: String,
        claim: String,
        reason: String,
        /// The operator ended the hold (expired the claim, or granted the lease on).
        by_operator: bool,
        deadline_in: i64,
    },
    /// The holder let go: `release` (or drop, or detach to let the claim expire).
    Released {
        lease: String,
        claim: String,
        how: String,
    },

    // ---- writers run by `kubectl fence run` ----
    /// CMD started with FENCE_TOKEN (it cannot ask whether it still holds: only the fences
    /// stop it, so it takes no part in the overlap check).
    CmdStarted {
        lease: String,
        claim: String,
        token: i64,
        pid: u32,
    },
    /// CMD was told to stop (SIGTERM from `kubectl fence` when the lease was lost).
    CmdStopped {
        lease: String,
        claim: String,
    },

    // ---- writes (both kinds of holder) ----
    /// `token`: the token the writer holds (stamped on what it writes, except on a workload).
    WriteAttempt {
        id: String,
        resource: Resource,
        key: String,
        lease: String,
        token: i64,
        /// How a workload write was made: `<verb> (client|kubectl)`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        how: Option<String>,
    },
    /// Accepted; `seq` is the resource's own order when the answer carries it.
    WriteAccepted {
        id: String,
        seq: Option<u64>,
    },
    /// Refused by the fence: a higher token was accepted before (`highest`), or the writer's
    /// pod does not hold the lease (`not_holder`: the apiserver's message; `highest` 0).
    WriteRefused {
        id: String,
        highest: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        not_holder: Option<String>,
        /// Any other refusal: the apiserver's status code and message (writes no lease
        /// fences, [`Resource::Unfenced`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refusal: Option<String>,
    },
    /// No answer (timeout, connection lost): it may or may not have been applied.
    WriteFailed {
        id: String,
        error: String,
    },

    // ---- the observer (watches of the API) ----
    /// A FencedLease as a watch delivered it (or as a stale holder read it).
    LeaseState {
        lease: String,
        uid: String,
        rv: u64,
        holder: Option<String>,
        identity: Option<String>,
        token: i64,
        term: Option<i32>,
        waiting: i32,
        /// The holder's pod UID (`status.holder.podUid`): the pod the identity rule lets write.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pod: Option<String>,
        /// For a lease that follows a coordination Lease: that Lease, whose holder this is
        /// (`holder` is then `<identity>@<leaseTransitions>`: a followed holder has no claim).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        follows: Option<String>,
    },
    LeaseGone {
        lease: String,
        uid: String,
    },
    /// A fenced object as a watch delivered it: each accepted write of it.
    ObjectState {
        key: String,
        rv: u64,
        token: Option<i64>,
        write: Option<String>,
    },
    /// A resource's own log of accepted writes, read after the run.
    ResourceLog {
        resource: Resource,
        key: String,
        entries: Vec<LogEntry>,
    },

    // ---- the nemesis and the runner ----
    FaultStart {
        kind: FaultKind,
        detail: String,
        target: Option<Target>,
        /// The lease it acts on, if one.
        lease: Option<String>,
    },
    FaultEnd {
        kind: FaultKind,
        detail: String,
    },
    /// An edit of a lease's `spec.fence` by the nemesis (cluster-admin), and how the apiserver
    /// answered: `invalid` edits must be refused at admission (I8, I12); a valid one is
    /// accepted, and `in_force` says whether the operator then put it in place (`None`: not
    /// asked, or no answer), as the lease's `Held` condition said.
    FenceEdit {
        lease: String,
        edit: String,
        invalid: bool,
        accepted: bool,
        /// The apiserver's answer: `accepted`, or the status code and message.
        answer: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        in_force: Option<bool>,
    },
    /// `pod`: the UID of the pod a holder process runs as (its token is bound to it).
    Spawned {
        process: String,
        pid: u32,
        lease: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pod: Option<String>,
    },
    Exited {
        process: String,
        status: String,
    },
    /// The workload stops here (holders are told to stop; nothing after counts for liveness).
    RunEnd {},
}

/// Appends entries to one process's history file, one `write` per line, unbuffered, so a
/// process killed with SIGKILL loses nothing it recorded.
pub struct Recorder {
    process: String,
    file: Mutex<std::fs::File>,
}

impl Recorder {
    pub fn create(path: &Path, process: &str) -> Self {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("open history {}: {e}", path.display()));
        Recorder {
            process: process.into(),
            file: Mutex::new(file),
        }
    }

    pub fn process(&self) -> &str {
        &self.process
    }

    /// Records `ev` as happening now.
    pub fn record(&self, ev: Event) {
        self.record_at(now(), ev);
    }

    /// Records `ev` as happening at `t` (taken when it happened, before any locking here).
    pub fn record_at(&self, t: u64, ev: Event) {
        let entry = Entry {
            t,
            p: self.process.clone(),
            ev,
        };
        let mut line = serde_json::to_string(&entry).expect("serialize event");
        line.push('\n');
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        // A failed write (disk full) must not look like a clean history.
        file.write_all(line.as_bytes()).expect("append to history");
    }
}

/// Reads every `*.jsonl` file of `dir` and returns the entries ordered by time. A line cut
/// short (a process killed mid-write) is skipped and counted.
pub fn load(dir: &Path) -> std::io::Result<(Vec<Entry>, usize)> {
    let mut entries = vec![];
    let mut damaged = 0;
    for file in std::fs::read_dir(dir)? {
        let path = file?.path();
        if path.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match serde_json::from_str::<Entry>(line) {
                Ok(entry) => entries.push(entry),
                Err(_) => damaged += 1,
            }
        }
    }
    entries.sort_by_key(|e| e.t);
    Ok((entries, damaged))
}
