//! `kubectl fence status LEASE -w`: the lease as it is, then a line each time it changes
//! hands (a new holder, a new token, no holder, the lease deleted or created again), until
//! interrupted. Heartbeats and queue moves print nothing.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::jiff::{Timestamp, Unit};
use kube::Client;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};

use super::commands::{LEASE_NAME_PREFIX, get_lease, print_as, read};
use super::report::LeaseReport;
use super::{Failure, ReportFormat, exit};
use fenced_lease::api::{FencedLease, FencedLeaseClaim};

/// What a line is printed for: who holds the lease, with which token; `None` while the lease
/// does not exist.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Hands(Option<(Option<String>, i64)>);

impl Hands {
    fn of(report: &LeaseReport) -> Self {
        Hands(Some((
            report.holder.as_ref().map(|h| h.claim.clone()),
            report.token,
        )))
    }
}

/// The table's header, and its row for `report` (`None`: the lease was deleted) at `now`.
const HEADER: &str =
    "TIME                  HOLDER                CLAIM                           TOKEN   WAITING";

fn row(report: Option<&LeaseReport>, now: Timestamp) -> String {
    let now = now.round(Unit::Second).unwrap_or(now);
    let Some(report) = report else {
        return format!("{now:<20}  <lease deleted>");
    };
    let (holder, claim) = match &report.holder {
        Some(h) => (h.identity.as_str(), h.claim.as_str()),
        None => ("<none>", ""),
    };
    format!(
        "{now:<20}  {holder:<20}  {claim:<30}  {token:<6}  {waiting}",
        token = report.token,
        waiting = report.waiting.len()
    )
}

/// Prints the lease now, then at each change of hands; returns only on an error.
pub(super) async fn status(
    client: Client,
    namespace: &str,
    lease: &str,
    output: Option<ReportFormat>,
    timeout: Option<Duration>,
) -> Result<u8, Failure> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), namespace);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client, namespace);
    let found = get_lease(&leases, lease, timeout).await?;
    let print = |report: Option<&LeaseReport>| -> Result<(), Failure> {
        match output {
            None | Some(ReportFormat::Wide) => println!("{}", row(report, Timestamp::now())),
            Some(ReportFormat::Name) => println!("{LEASE_NAME_PREFIX}{lease}"),
            Some(ReportFormat::Json) => print_as(&report, true)?,
            Some(ReportFormat::Yaml) => print_as(&report, false)?,
        }
        Ok(())
    };
    let claims = &claims;
    let report = move |lease: FencedLease| async move {
        let list = read(
            "list FencedLeaseClaims",
            timeout,
            claims.list(&ListParams::default()),
        )
        .await?;
        Ok::<_, Failure>(LeaseReport::new(&lease, &list.items))
    };

    if matches!(output, None | Some(ReportFormat::Wide)) {
        println!("{HEADER}");
    }
    let first = report(found).await?;
    let mut shown = Hands::of(&first);
    print(Some(&first))?;

    let config = watcher::Config::default().fields(&format!("metadata.name={lease}"));
    let events = watcher(leases, config).default_backoff();
    futures::pin_mut!(events);
    // Whether a relist (after a lost watch) listed the lease: if not, it went meanwhile.
    let mut relisted = false;
    while let Some(event) = events.next().await {
        let object = match event {
            Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => {
                relisted = true;
                Some(l)
            }
            Ok(watcher::Event::Delete(_)) => None,
            Ok(watcher::Event::Init) => {
                relisted = false;
                continue;
            }
            Ok(watcher::Event::InitDone) if relisted => continue,
            Ok(watcher::Event::InitDone) => None,
            Err(e) => {
                eprintln!("kubectl fence: watching {lease}: {e} (retrying)");
                continue;
            }
        };
        let now = match object {
            Some(object) => Some(report(object).await?),
            None => None,
        };
        let hands = now.as_ref().map_or(Hands(None), Hands::of);
        if hands != shown {
            shown = hands;
            print(now.as_ref())?;
        }
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::HolderReport;

    fn report(holder: Option<&str>, token: i64) -> LeaseReport {
        LeaseReport {
            namespace: "ns".into(),
            name: "db".into(),
            lease_duration_seconds: 15,
            term_duration_seconds: None,
            token,
            follows: None,
            holder: holder.map(|h| HolderReport {
                claim: format!("{h}-claim"),
                identity: h.into(),
                pod: None,
                acquire_time: None,
                renew_time: None,
                expire_time: None,
            }),
            waiting: vec![],
            created: None,
        }
    }

    #[test]
    fn a_line_is_due_when_the_holder_or_the_token_changes_and_not_otherwise() {
        let a = report(Some("a"), 3);
        let mut later = a.clone();
        later.waiting = report(None, 3).waiting;
        later.lease_duration_seconds = 30;
        assert_eq!(Hands::of(&a), Hands::of(&later), "no change of hands");
        assert_ne!(Hands::of(&a), Hands::of(&report(Some("b"), 4)));
        assert_ne!(Hands::of(&a), Hands::of(&report(None, 3)), "released");
        assert_ne!(Hands::of(&a), Hands(None), "deleted");
    }

    #[test]
    fn rows_name_the_holder_its_claim_and_token_under_the_header() {
        let now: Timestamp = "2026-12-02T11:30:00.6Z".parse().unwrap();
        let line = row(Some(&report(Some("worker-a"), 7)), now);
        assert!(
            line.starts_with("2026-12-02T11:30:01Z  worker-a "),
            "{line}"
        );
        let fields: Vec<_> = line.split_whitespace().collect();
        assert_eq!(
            fields,
            [
                "2026-12-02T11:30:01Z",
                "worker-a",
                "worker-a-claim",
                "7",
                "0"
            ]
        );
        let columns: Vec<_> = HEADER.split_whitespace().collect();
        assert_eq!(columns.len(), fields.len());
        assert_eq!(HEADER.find("TOKEN"), line.find(" 7 ").map(|i| i + 1));
        assert!(row(Some(&report(None, 7)), now).contains("<none>"));
        assert!(row(None, now).ends_with("<lease deleted>"));
    }
}
