//! The last refused write of a lease, for `kubectl fence status`: read from the `WriteRefused`
//! Events the refused holders sent on the FencedLease (`holder::refusals`).

use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde::Serialize;

use fenced_lease::api::WRITE_REFUSED_REASON;

/// The lease's refused writes, as their holders reported them.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusalReport {
    /// When the last one was refused (as its holder observed it).
    pub time: Option<Timestamp>,
    /// Who was refused last: its pod, or its user outside pods.
    pub by: String,
    /// What the last refusal said: the claim, the token it had, and the resource's mark.
    pub note: String,
    /// Refusals reported in the Events the cluster still keeps (an Event lives an hour by
    /// default), every reporter's.
    pub count: u64,
}

impl RefusalReport {
    /// The report of `events` (the WriteRefused Events of one lease), or `None` when there is
    /// none.
    pub fn of(events: &[Event]) -> Option<RefusalReport> {
        let observed = |e: &Event| {
            e.series
                .as_ref()
                .map(|s| s.last_observed_time.0)
                .or_else(|| e.event_time.as_ref().map(|t| t.0))
                .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
        };
        let count = |e: &Event| {
            e.series
                .as_ref()
                .map_or(1, |s| u64::try_from(s.count).unwrap_or(1).max(1))
        };
        let last = events.iter().max_by_key(|e| observed(e))?;
        Some(RefusalReport {
            time: observed(last),
            by: last.reporting_instance.clone().unwrap_or_default(),
            note: last.note.clone().unwrap_or_default(),
            count: events.iter().map(count).sum(),
        })
    }
}

/// The refusal Events of lease `namespace/lease`; `None` when this user may not list Events
/// (asked first, so that no request is refused), and on any failure to read them, which must
/// not fail `status`.
pub async fn read(
    client: Client,
    namespace: &str,
    lease: &str,
    timeout: Duration,
) -> Option<Vec<Event>> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some("events.k8s.io".into()),
                resource: Some("events".into()),
                verb: Some("list".into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let post = PostParams::default();
    let asked = tokio::time::timeout(timeout, reviews.create(&post, &review));
    let allowed = asked.await.ok()?.ok()?.status.is_some_and(|s| s.allowed);
    if !allowed {
        return None;
    }
    let events: Api<Event> = Api::namespaced(client, namespace);
    let selector =
        format!("reason={WRITE_REFUSED_REASON},regarding.kind=FencedLease,regarding.name={lease}");
    let params = ListParams::default().fields(&selector);
    let listed = tokio::time::timeout(timeout, events.list(&params)).await;
    Some(listed.ok()?.ok()?.items)
}

/// `status`'s lines about refusals: `events` as [`read`] gave them.
pub fn detail(events: Option<&[Event]>, now: Timestamp) -> String {
    let Some(events) = events else {
        return "Refused:   unknown (listing events.k8s.io Events is not allowed here)\n".into();
    };
    let Some(r) = RefusalReport::of(events) else {
        return "Refused:   none reported\n".into();
    };
    let when = r.time.map_or("-".into(), |t| {
        format!("{t} ({})", super::report::relative(t, now))
    });
    let times = if r.count == 1 {
        "once".to_string()
    } else {
        format!("{} times", r.count)
    };
    format!(
        "Refused:   {times}; last {when}, {} was refused: {}\n",
        r.by, r.note
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(by: &str, at: &str, count: Option<i32>, note: &str) -> Event {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("payouts.{by}")},
            "eventTime": at,
            "reason": "WriteRefused",
            "reportingInstance": by,
            "note": note,
            "series": count.map(|c| serde_json::json!({"count": c, "lastObservedTime": at})),
        }))
        .unwrap()
    }

    #[test]
    fn the_last_refusal_and_every_reporters_count() {
        let events = [
            event(
                "pa",
                "2026-12-07T10:00:05.000000Z",
                Some(3),
                "token 7 is lower than 9",
            ),
            event(
                "pc",
                "2026-12-07T10:00:09.000000Z",
                None,
                "token 8 is lower than 9",
            ),
        ];
        let report = RefusalReport::of(&events).unwrap();
        assert_eq!((report.by.as_str(), report.count), ("pc", 4));
        assert_eq!(report.note, "token 8 is lower than 9");
        assert_eq!(RefusalReport::of(&[]), None);
        let now: Timestamp = "2026-12-07T10:01:09Z".parse().unwrap();
        let text = detail(Some(&events), now);
        assert!(
            text.starts_with(
                "Refused:   4 times; last 2026-12-07T10:00:09Z (1m ago), pc was refused: token 8"
            ),
            "{text}"
        );
        assert!(detail(None, now).contains("unknown"));
        assert_eq!(detail(Some(&[]), now), "Refused:   none reported\n");
    }
}
