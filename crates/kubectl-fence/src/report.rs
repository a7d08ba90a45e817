//! What `kubectl fence status` and `list` show, built from a lease and its claims (pure), and
//! rendered as a table, JSON or YAML.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use serde::Serialize;

use fenced_lease::api::{ClaimPhase, FencedLease, FencedLeaseClaim};

/// One lease: who holds it, its token, and its queue.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseReport {
    pub namespace: String,
    pub name: String,
    /// `spec.leaseDurationSeconds`: the duration of the next term.
    pub lease_duration_seconds: i32,
    /// The running term's duration, fixed at its grant, when the operator says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub term_duration_seconds: Option<i32>,
    /// The last token issued.
    pub token: i64,
    /// The coordination Lease whose holder holds this lease (`spec.follow`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub follows: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<HolderReport>,
    /// Pending claims, next first.
    pub waiting: Vec<QueuedClaim>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<Timestamp>,
}

/// The current holder.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HolderReport {
    /// Empty for the holder of a followed Lease.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub claim: String,
    pub identity: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquire_time: Option<Timestamp>,
    /// The holder's last heartbeat (its own clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<Timestamp>,
    /// When it expires if no further heartbeat comes (heartbeat + duration; an estimate: the
    /// operator times expiry on its own clock from when it saw the heartbeat).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expire_time: Option<Timestamp>,
}

/// A claim waiting in the queue.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuedClaim {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<i32>,
    pub claim: String,
    pub identity: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The waiter's last heartbeat (its own clock): a waiter that stopped heartbeating is
    /// skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<Timestamp>,
}

/// Which columns `list` shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Columns {
    /// A NAMESPACE column (`-A`).
    pub namespace: bool,
    /// DURATION, CLAIM, POD and FOLLOWS columns (`-o wide`).
    pub wide: bool,
}

impl LeaseReport {
    /// The report of `lease`, given the claims of its namespace (others are ignored).
    pub fn new(lease: &FencedLease, claims: &[FencedLeaseClaim]) -> Self {
        let name = lease.name_any();
        let status = lease.status.clone().unwrap_or_default();
        let term = status
            .lease_duration_seconds
            .filter(|_| status.holder.is_some());
        let duration = SignedDuration::from_secs(i64::from(lease.term_seconds()));
        let mine = || claims.iter().filter(|c| c.spec.lease_name == name);
        let holder = status.holder.as_ref().map(|h| {
            let renew_time = mine()
                .find(|c| c.name_any() == h.claim)
                .and_then(|c| c.spec.renew_time.as_ref())
                .map(|t| t.0);
            HolderReport {
                claim: h.claim.clone(),
                identity: h.identity.clone(),
                pod: h.pod_name.clone(),
                acquire_time: status.acquire_time.as_ref().map(|t| t.0),
                renew_time,
                expire_time: renew_time.and_then(|t| t.checked_add(duration).ok()),
            }
        });
        let holder_claim = holder.as_ref().map(|h| h.claim.clone());
        let mut waiting: Vec<QueuedClaim> = mine()
            .filter(|c| Some(c.name_any()) != holder_claim)
            .filter(|c| {
                let phase = c.status.as_ref().and_then(|s| s.phase);
                matches!(phase, None | Some(ClaimPhase::Pending))
            })
            .map(|c| QueuedClaim {
                position: c.status.as_ref().and_then(|s| s.queue_position),
                claim: c.name_any(),
                identity: c.spec.holder_identity.clone(),
                pod: c.spec.pod_name.clone(),
                renew_time: c.spec.renew_time.as_ref().map(|t| t.0),
                created: c.metadata.creation_timestamp.as_ref().map(|t| t.0),
            })
            .collect();
        waiting.sort_by_key(|q| (q.position.unwrap_or(i32::MAX), q.created, q.claim.clone()));
        LeaseReport {
            namespace: lease.namespace().unwrap_or_default(),
            name,
            lease_duration_seconds: lease.spec.lease_duration_seconds,
            term_duration_seconds: term,
            token: status.fencing_token,
            follows: lease.spec.follow.as_ref().map(|f| f.lease.clone()),
            holder,
            waiting,
            created: lease.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }

    /// `kubectl fence status` as text, times relative to `now`; `wide` adds the waiters'
    /// pods and heartbeats.
    pub fn detail(&self, now: Timestamp, wide: bool) -> String {
        let term = match self.term_duration_seconds {
            Some(t) if t != self.lease_duration_seconds => format!(", running term {t}s"),
            _ => String::new(),
        };
        let mut out = format!(
            "Lease:     {}/{} (duration {}s{term})\nToken:     {}\n",
            self.namespace, self.name, self.lease_duration_seconds, self.token
        );
        if let Some(lease) = &self.follows {
            out.push_str(&format!(
                "Follows:   Lease {lease} (coordination.k8s.io): its holder holds this lease\n"
            ));
        }
        match &self.holder {
            None => out.push_str("Holder:    <none>\n"),
            Some(h) => {
                let pod = h
                    .pod
                    .as_deref()
                    .map(|p| format!(", pod {p}"))
                    .unwrap_or_default();
                let of = match (&self.follows, h.claim.as_str()) {
                    (Some(lease), "") => format!("holder of Lease {lease}"),
                    _ => format!("claim {}", h.claim),
                };
                out.push_str(&format!("Holder:    {} ({of}{pod})\n", h.identity));
                if let Some(t) = h.acquire_time {
                    out.push_str(&format!("Acquired:  {t} ({})\n", relative(t, now)));
                }
                if let Some(t) = h.renew_time {
                    out.push_str(&format!("Heartbeat: {t} ({})\n", relative(t, now)));
                }
                if let Some(t) = h.expire_time {
                    out.push_str(&format!(
                        "Expires:   {t} ({}, unless renewed)\n",
                        relative(t, now)
                    ));
                }
            }
        }
        out.push_str(&format!("Waiting:   {}\n", self.waiting.len()));
        if !self.waiting.is_empty() {
            let mut header = vec![
                "  POSITION".to_string(),
                "CLAIM".into(),
                "HOLDER".into(),
                "AGE".into(),
            ];
            if wide {
                header.extend(["POD".into(), "HEARTBEAT".into()]);
            }
            let mut rows = vec![header];
            rows.extend(self.waiting.iter().map(|q| {
                let mut row = vec![
                    format!("  {}", q.position.map_or("-".into(), |p| p.to_string())),
                    q.claim.clone(),
                    q.identity.clone(),
                    q.created.map_or("-".into(), |t| age(t, now)),
                ];
                if wide {
                    row.push(q.pod.clone().unwrap_or_else(|| "<none>".into()));
                    row.push(q.renew_time.map_or("-".into(), |t| relative(t, now)));
                }
                row
            }));
            out.push_str(&table(&rows));
        }
        out
    }
}

/// `kubectl fence list` as a table.
pub fn list_table(reports: &[LeaseReport], now: Timestamp, columns: Columns) -> String {
    let mut header: Vec<String> = Vec::new();
    if columns.namespace {
        header.push("NAMESPACE".into());
    }
    header.extend(["NAME", "HOLDER", "TOKEN", "WAITING", "EXPIRES"].map(String::from));
    if columns.wide {
        header.extend(["DURATION", "CLAIM", "POD", "FOLLOWS"].map(String::from));
    }
    header.push("AGE".into());
    let mut rows = vec![header];
    rows.extend(reports.iter().map(|r| {
        let holder = r.holder.as_ref();
        let mut row = Vec::new();
        if columns.namespace {
            row.push(r.namespace.clone());
        }
        row.extend([
            r.name.clone(),
            holder.map_or("<none>".into(), |h| h.identity.clone()),
            r.token.to_string(),
            r.waiting.len().to_string(),
            holder
                .and_then(|h| h.expire_time)
                .map_or("-".into(), |t| relative(t, now)),
        ]);
        if columns.wide {
            row.extend([
                format!(
                    "{}s",
                    r.term_duration_seconds.unwrap_or(r.lease_duration_seconds)
                ),
                holder
                    .map(|h| h.claim.clone())
                    .filter(|c| !c.is_empty())
                    .unwrap_or_else(|| "<none>".into()),
                holder
                    .and_then(|h| h.pod.clone())
                    .unwrap_or_else(|| "<none>".into()),
                r.follows
                    .as_ref()
                    .map_or("-".into(), |l| format!("Lease/{l}")),
            ]);
        }
        row.push(r.created.map_or("-".into(), |t| age(t, now)));
        row
    }));
    table(&rows)
}

/// Left-aligned columns, three spaces apart, like kubectl.
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}   ", width = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// "12s ago" / "in 3s".
pub fn relative(t: Timestamp, now: Timestamp) -> String {
    let d = t.duration_since(now);
    if d.is_negative() {
        format!("{} ago", short(d.unsigned_abs()))
    } else {
        format!("in {}", short(d.unsigned_abs()))
    }
}

/// Age like kubectl: "12s", "3m4s", "2h5m", "3d".
pub fn age(t: Timestamp, now: Timestamp) -> String {
    short(now.duration_since(t).unsigned_abs())
}

fn short(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 if s.is_multiple_of(60) => format!("{}m", s / 60),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 if (s % 3600) / 60 == 0 => format!("{}h", s / 3600),
        3600..86400 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use kube::Resource;

    use super::*;

    fn lease(status: serde_json::Value) -> FencedLease {
        serde_json::from_value(serde_json::json!({
            "apiVersion": FencedLease::api_version(&()), "kind": "FencedLease",
            "metadata": {"name": "db", "namespace": "prod", "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"leaseDurationSeconds": 15},
            "status": status,
        }))
        .unwrap()
    }

    fn claim(name: &str, lease: &str, who: &str, status: serde_json::Value) -> FencedLeaseClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": FencedLeaseClaim::api_version(&()), "kind": "FencedLeaseClaim",
            "metadata": {"name": name, "namespace": "prod", "creationTimestamp": "2024-01-01T00:00:10Z"},
            "spec": {"leaseName": lease, "holderIdentity": who, "renewTime": "2024-01-01T00:01:00.000000Z"},
            "status": status,
        }))
        .unwrap()
    }

    fn now() -> Timestamp {
        "2024-01-01T00:01:05Z".parse().unwrap()
    }

    /// `db`, held by worker-1 with token 7, two waiting; an expired claim and another lease's.
    fn held_with_a_queue() -> LeaseReport {
        let lease = lease(serde_json::json!({
            "fencingToken": 7,
            "holder": {"claim": "db-a", "claimUid": "u", "identity": "worker-1", "podName": "worker-1"},
            "acquireTime": "2024-01-01T00:00:30.000000Z",
        }));
        let claims = [
            claim(
                "db-a",
                "db",
                "worker-1",
                serde_json::json!({"phase": "Granted", "fencingToken": 7}),
            ),
            claim(
                "db-c",
                "db",
                "worker-3",
                serde_json::json!({"phase": "Pending", "queuePosition": 2}),
            ),
            claim(
                "db-b",
                "db",
                "worker-2",
                serde_json::json!({"phase": "Pending", "queuePosition": 1}),
            ),
            claim(
                "db-old",
                "db",
                "worker-0",
                serde_json::json!({"phase": "Expired"}),
            ),
            claim(
                "other-a",
                "other",
                "worker-9",
                serde_json::json!({"phase": "Pending"}),
            ),
        ];
        LeaseReport::new(&lease, &claims)
    }

    #[test]
    fn status_shows_holder_token_expiry_and_the_queue_in_order() {
        let report = held_with_a_queue();
        assert_eq!(report.token, 7);
        let holder = report.holder.clone().unwrap();
        assert_eq!(holder.identity, "worker-1");
        assert_eq!(
            holder.expire_time,
            Some("2024-01-01T00:01:15Z".parse().unwrap())
        );
        let queue: Vec<_> = report.waiting.iter().map(|q| q.claim.as_str()).collect();
        assert_eq!(queue, ["db-b", "db-c"]);

        let text = report.detail(now(), false);
        assert!(text.contains("Token:     7"), "{text}");
        assert!(
            text.contains("Holder:    worker-1 (claim db-a, pod worker-1)"),
            "{text}"
        );
        assert!(text.contains("(in 10s, unless renewed)"), "{text}");
        assert!(text.contains("Waiting:   2"), "{text}");

        let wide = report.detail(now(), true);
        assert!(wide.contains("HEARTBEAT"), "{wide}");
        assert!(wide.contains("5s ago"), "{wide}");
    }

    #[test]
    fn list_shows_one_line_per_lease_with_the_columns_asked_for() {
        let report = held_with_a_queue();
        let listed = list_table(std::slice::from_ref(&report), now(), Columns::default());
        let lines: Vec<_> = listed.lines().collect();
        assert_eq!(
            lines[0],
            "NAME   HOLDER     TOKEN   WAITING   EXPIRES   AGE"
        );
        assert_eq!(
            lines[1],
            "db     worker-1   7       2         in 10s    1m5s"
        );
        let listed = list_table(
            &[report],
            now(),
            Columns {
                namespace: true,
                wide: true,
            },
        );
        let lines: Vec<_> = listed.lines().collect();
        assert_eq!(
            lines[0],
            "NAMESPACE   NAME   HOLDER     TOKEN   WAITING   EXPIRES   DURATION   CLAIM   POD        FOLLOWS   AGE"
        );
        assert_eq!(
            lines[1],
            "prod        db     worker-1   7       2         in 10s    15s        db-a    worker-1   -         1m5s"
        );
    }

    #[test]
    fn a_following_lease_says_which_lease_it_follows_and_names_no_claim() {
        let mut lease = lease(serde_json::json!({
            "fencingToken": 9,
            "holder": {"identity": "ctrl-0_5f1e", "podName": "ctrl-0", "podUid": "p",
                       "lease": {"name": "ctrl", "uid": "l", "leaseTransitions": 2}},
        }));
        lease.spec.follow = Some(fenced_lease::api::FollowSpec {
            lease: "ctrl".into(),
        });
        let report = LeaseReport::new(&lease, &[]);
        assert_eq!(report.follows.as_deref(), Some("ctrl"));
        let text = report.detail(now(), false);
        assert!(
            text.contains("Follows:   Lease ctrl (coordination.k8s.io)"),
            "{text}"
        );
        assert!(
            text.contains("Holder:    ctrl-0_5f1e (holder of Lease ctrl, pod ctrl-0)"),
            "{text}"
        );
        let wide = Columns {
            namespace: false,
            wide: true,
        };
        let listed = list_table(std::slice::from_ref(&report), now(), wide);
        let row: Vec<_> = listed.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(row[6..9], ["<none>", "ctrl-0", "Lease/ctrl"], "{listed}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["follows"], "ctrl");
        assert!(json["holder"].get("claim").is_none(), "{json}");
    }

    #[test]
    fn the_running_terms_duration_is_shown_and_used_for_expiry() {
        let lease = lease(serde_json::json!({
            "fencingToken": 7, "leaseDurationSeconds": 60,
            "holder": {"claim": "db-a", "claimUid": "u", "identity": "worker-1"},
        }));
        let claims = [claim(
            "db-a",
            "db",
            "worker-1",
            serde_json::json!({"phase": "Granted", "fencingToken": 7}),
        )];
        let report = LeaseReport::new(&lease, &claims);
        assert_eq!(report.term_duration_seconds, Some(60));
        assert_eq!(
            report.holder.unwrap().expire_time,
            Some("2024-01-01T00:02:00Z".parse().unwrap())
        );
    }

    #[test]
    fn a_free_lease_has_no_holder() {
        let report = LeaseReport::new(&lease(serde_json::json!({"fencingToken": 3})), &[]);
        assert_eq!(report.holder, None);
        assert!(report.detail(now(), false).contains("Holder:    <none>"));
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["token"], 3);
        assert!(json.get("holder").is_none());
    }

    #[test]
    fn durations_read_like_kubectl() {
        let t0: Timestamp = "2024-01-01T00:00:00Z".parse().unwrap();
        let at = |s: i64| t0.checked_add(SignedDuration::from_secs(s)).unwrap();
        assert_eq!(age(t0, at(59)), "59s");
        assert_eq!(age(t0, at(184)), "3m4s");
        assert_eq!(age(t0, at(7200)), "2h");
        assert_eq!(age(t0, at(3 * 86400 + 5)), "3d");
        assert_eq!(relative(at(10), t0), "in 10s");
        assert_eq!(relative(t0, at(10)), "10s ago");
    }
}
