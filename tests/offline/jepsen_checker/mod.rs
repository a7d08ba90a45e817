//! The safety suite's checker (tests/safety/jepsen/checker/) on synthetic histories: it must catch
//! each deliberate fault — a token issued twice, an expiry decided on the cache (two holders
//! believing at once), a fence that accepts a lower token — and stay quiet on a clean history.
//! Here the histories' builder ([`History`]); a module of cases per subject, as the checker's.

use crate::checker::{self, Config, Kind, Report, check};
use crate::history::{self, Entry, Event, FaultKind, LogEntry, Resource, Target};
use crate::step_downs;

mod clean;
mod fences;
mod grants;
mod processes;
mod stale;
mod unfenced;

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// A history written by hand: events with their time (ms) and process.
#[derive(Default)]
struct History(Vec<Entry>);

impl History {
    fn at(&mut self, ms: u64, p: &str, ev: Event) -> &mut Self {
        self.0.push(Entry {
            t: 1_000 * S + ms * MS,
            p: p.into(),
            ev,
        });
        self
    }

    /// `p` acquires `lease` with `token` at `from` and gets token() = Ok every 50 ms until `to`.
    fn holds(
        &mut self,
        p: &str,
        lease: &str,
        claim: &str,
        token: i64,
        from: u64,
        to: u64,
    ) -> &mut Self {
        self.at(
            from.saturating_sub(5),
            p,
            Event::Waiting {
                lease: lease.into(),
            },
        );
        self.at(
            from,
            p,
            Event::Acquired {
                lease: lease.into(),
                claim: claim.into(),
                token,
            },
        );
        let mut t = from;
        while t <= to {
            self.at(
                t + 1,
                p,
                Event::TokenOk {
                    lease: lease.into(),
                    claim: claim.into(),
                    token,
                    called: 1_000 * S + t * MS,
                },
            );
            t += 50;
        }
        self
    }

    /// The lease status as the watch saw it.
    fn status(
        &mut self,
        ms: u64,
        lease: &str,
        rv: u64,
        holder: Option<&str>,
        token: i64,
    ) -> &mut Self {
        self.at(
            ms,
            "observer",
            Event::LeaseState {
                lease: lease.into(),
                uid: "uid-1".into(),
                rv,
                holder: holder.map(Into::into),
                identity: holder.map(Into::into),
                token,
                term: Some(2),
                waiting: 1,
                pod: holder.map(|h| format!("pod-of-{h}")),
                follows: None,
            },
        )
    }

    /// `p` writes `token` to `resource`/`key` at `ms`, answered 5 ms later.
    fn write(
        &mut self,
        ms: u64,
        p: &str,
        id: &str,
        (resource, key): (Resource, &str),
        token: i64,
        answer: Event,
    ) -> &mut Self {
        self.at(
            ms,
            p,
            Event::WriteAttempt {
                id: id.into(),
                resource,
                key: key.into(),
                lease: "a".into(),
                token,
                how: None,
            },
        );
        self.at(ms + 5, p, answer)
    }

    fn log(
        &mut self,
        ms: u64,
        resource: Resource,
        key: &str,
        entries: &[(i64, &str)],
    ) -> &mut Self {
        let entries = entries
            .iter()
            .enumerate()
            .map(|(i, (token, write))| LogEntry {
                seq: i as u64 + 1,
                token: *token,
                write: (*write).into(),
            })
            .collect();
        self.at(
            ms,
            "runner",
            Event::ResourceLog {
                resource,
                key: key.into(),
                entries,
            },
        )
    }

    fn check(&self) -> Report {
        check(&self.0, &Config::default())
    }
}

fn accepted(id: &str) -> Event {
    Event::WriteAccepted {
        id: id.into(),
        seq: None,
    }
}

/// Two holders of lease `a` one after the other, each writing to PostgreSQL, as it should be.
fn clean() -> History {
    let mut h = History::default();
    h.status(0, "a", 10, Some("a-1"), 100)
        .holds("holder-0.0", "a", "a-1", 100, 10, 1_000)
        .write(
            300,
            "holder-0.0",
            "holder-0.0#0",
            (Resource::Postgres, "a"),
            100,
            accepted("holder-0.0#0"),
        )
        .at(
            1_100,
            "holder-0.0",
            Event::Released {
                lease: "a".into(),
                claim: "a-1".into(),
                how: "released".into(),
            },
        )
        .status(1_150, "a", 12, Some("a-2"), 101)
        .holds("holder-1.0", "a", "a-2", 101, 1_200, 2_000)
        .write(
            1_500,
            "holder-1.0",
            "holder-1.0#0",
            (Resource::Postgres, "a"),
            101,
            accepted("holder-1.0#0"),
        )
        .log(
            3_000,
            Resource::Postgres,
            "a",
            &[(100, "holder-0.0#0"), (101, "holder-1.0#0")],
        );
    h
}

fn only(report: &Report, kind: Kind) -> String {
    let kinds: Vec<Kind> = report.violations.iter().map(|v| v.kind).collect();
    assert!(
        !kinds.is_empty() && kinds.iter().all(|k| *k == kind),
        "expected only {kind:?}, got {:#?}",
        report.violations
    );
    let first = report.first_violation().unwrap();
    assert_eq!(first.kind, kind);
    first.message.clone()
}

// ---- stale-writer (I11): writes of pods that no longer held the lease ----

impl History {
    /// The runner started process `p` as pod `pod`.
    fn spawned(&mut self, ms: u64, p: &str, pod: &str) -> &mut Self {
        self.at(
            ms,
            "runner",
            Event::Spawned {
                process: p.into(),
                pid: 1,
                lease: "a".into(),
                pod: Some(pod.into()),
            },
        )
    }

    /// `p` writes the workload of lease `a` (no token stamped) at `ms`; `answer` 5 ms later.
    fn workload(&mut self, ms: u64, p: &str, id: &str, token: i64, answer: Event) -> &mut Self {
        self.write(
            ms,
            p,
            id,
            (Resource::Workload, "deployments/jepsen-a/scale"),
            token,
            answer,
        )
    }
}

impl History {
    /// The collateral writer writes ConfigMap `free` at `ms`, answered 5 ms later with `answer`.
    fn unfenced(&mut self, ms: u64, id: &str, answer: Event) -> &mut Self {
        self.at(
            ms,
            "collateral",
            Event::WriteAttempt {
                id: id.into(),
                resource: Resource::Unfenced,
                key: "configmaps/jepsen-free-0".into(),
                lease: String::new(),
                token: 0,
                how: Some("merge patch as cluster-admin".into()),
            },
        )
        .at(ms + 5, "collateral", answer)
    }

    fn fault(&mut self, from: u64, to: u64, kind: FaultKind) -> &mut Self {
        self.at(
            from,
            "nemesis",
            Event::FaultStart {
                kind,
                detail: String::new(),
                target: None,
                lease: None,
            },
        )
        .at(
            to,
            "nemesis",
            Event::FaultEnd {
                kind,
                detail: String::new(),
            },
        )
    }
}

const LEFT_BEHIND: &str = "422 Invalid: configmaps \"jepsen-free-0\" is forbidden: ValidatingAdmissionPolicy 'fenced-lease-kinds.ns.d' with binding 'fenced-lease-kinds.ns.d' denied request: failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction";

const UNCONFIGURED: &str = "422 Invalid: configmaps \"jepsen-free-0\" is forbidden: ValidatingAdmissionPolicy 'fenced-lease-kinds.ns.d' denied request: failed to configure policy: failed to find resource referenced by paramKind: 'fencing.dev/v1alpha1, Kind=FencedLease'";

impl History {
    /// Lease `a` as the watch saw it while it followed Lease `a-election`: `holder` is the
    /// client-go leader (identity, the Lease's transitions, its pod), or nobody.
    fn followed(
        &mut self,
        ms: u64,
        rv: u64,
        holder: Option<(&str, i64, &str)>,
        token: i64,
    ) -> &mut Self {
        self.at(
            ms,
            "observer",
            Event::LeaseState {
                lease: "a".into(),
                uid: "uid-1".into(),
                rv,
                holder: holder.map(|(id, n, _)| format!("{id}@{n}")),
                identity: holder.map(|(id, _, _)| id.into()),
                token,
                term: Some(3),
                waiting: 0,
                pod: holder.map(|(_, _, pod)| pod.into()),
                follows: holder.map(|_| "a-election".into()),
            },
        )
    }

    fn learns(&mut self, ms: u64, p: &str, claim: &str, token: i64) -> &mut Self {
        self.at(
            ms,
            p,
            Event::Acquired {
                lease: "a".into(),
                claim: claim.into(),
                token,
            },
        )
    }
}
