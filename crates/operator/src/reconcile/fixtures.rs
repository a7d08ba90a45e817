//! A scripted apiserver for the reconcilers' unit tests, as controller-rs's `fixtures.rs`: an
//! in-process `tower` service (an axum router with one fallback) behind a real
//! [`kube::Client`], which expects a sequence of requests (method, path, checks of the body)
//! and answers each as scripted. A request out of script is answered 500 and noted;
//! [`Apiserver::done`] fails the test on any, and on a scripted request that never came.
//!
//! Beside it, a [`World`]: the [`Context`] a reconcile runs in, with caches the test fills as
//! the watches would, and the Events it queued.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::response::Response;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::Event;
use kube::runtime::reflector;
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::finalizer::FINALIZER;
use crate::admission::Admission;
use crate::context::{Context, Kube};
use crate::events::Events;
use crate::metrics::Metrics;
use crate::state::heartbeat::beat_of;
use crate::state::{CachedClaim, Memory, Writers, locked};
use fenced_lease_api::{FencedLease, FencedLeaseClaim};

/// The namespace of the leases and claims of every test.
pub const NS: &str = "team";
/// The operator's own namespace (the token records').
pub const STATE_NS: &str = "fenced-lease-system";

/// The path of lease `name`.
pub fn lease_path(name: &str) -> String {
    format!("/apis/fencing.dev/v1alpha1/namespaces/{NS}/fencedleases/{name}")
}

/// The path of claim `name`.
pub fn claim_path(name: &str) -> String {
    format!("/apis/fencing.dev/v1alpha1/namespaces/{NS}/fencedleaseclaims/{name}")
}

/// The path of the status of the object at `path`.
pub fn status(path: String) -> String {
    format!("{path}/status")
}

/// The path of the ConfigMaps of the operator's namespace; with `Some(ns)`, of the token
/// records of lease namespace `ns`.
pub fn records_path(ns: Option<&str>) -> String {
    let path = format!("/api/v1/namespaces/{STATE_NS}/configmaps");
    ns.map_or(path.clone(), |ns| {
        format!("{path}/fenced-lease-tokens.{ns}")
    })
}

/// A check of a request's body, and what it checks.
type Check = (&'static str, Box<dyn Fn(&Value) -> bool + Send>);

/// One request the script expects, and its answer.
pub struct Exchange {
    method: Method,
    path: String,
    checks: Vec<Check>,
    answer: Answer,
}

enum Answer {
    /// 200, this object.
    Object(Value),
    /// 200, the body sent, its resourceVersion raised (a PUT or a POST as the apiserver
    /// stores it).
    Echo,
    /// 200, this object with the JSON merge patch sent applied, its resourceVersion raised.
    Patched(Value),
    /// An error Status: code, reason.
    Refused(u16, &'static str),
}

/// A `method` request of `path`, answered with the body sent (see [`Exchange::echo`]) unless
/// told otherwise.
pub fn expect(method: Method, path: impl Into<String>) -> Exchange {
    Exchange {
        method,
        path: path.into(),
        checks: Vec::new(),
        answer: Answer::Echo,
    }
}

impl Exchange {
    /// The request's body (JSON; `null` when empty) must pass `check`, which says `what`.
    pub fn check(
        mut self,
        what: &'static str,
        check: impl Fn(&Value) -> bool + Send + 'static,
    ) -> Self {
        self.checks.push((what, Box::new(check)));
        self
    }

    /// Answered 200 with `object`.
    pub fn answer(mut self, object: impl serde::Serialize) -> Self {
        self.answer = Answer::Object(serde_json::to_value(object).unwrap_or_default());
        self
    }

    /// Answered 200 with `object`, the merge patch sent applied and its resourceVersion raised.
    pub fn patched(mut self, object: impl serde::Serialize) -> Self {
        self.answer = Answer::Patched(serde_json::to_value(object).unwrap_or_default());
        self
    }

    /// Answered 404 NotFound.
    pub fn not_found(mut self) -> Self {
        self.answer = Answer::Refused(404, "NotFound");
        self
    }

    /// Answered 409 Conflict (the object changed since it was read).
    pub fn conflict(mut self) -> Self {
        self.answer = Answer::Refused(409, "Conflict");
        self
    }
}

/// A request as it was sent.
#[derive(Clone, Debug)]
pub struct Sent {
    pub method: Method,
    pub path: String,
    pub body: Value,
}

#[derive(Default)]
struct Script {
    expected: VecDeque<Exchange>,
    sent: Vec<Sent>,
    wrong: Vec<String>,
}

/// The test's end of the scripted apiserver.
pub struct Apiserver {
    script: Arc<Mutex<Script>>,
}

/// A client of an apiserver that expects `script`, in that order.
pub fn scripted(script: Vec<Exchange>) -> (kube::Client, Apiserver) {
    let script = Arc::new(Mutex::new(Script {
        expected: script.into(),
        ..Script::default()
    }));
    let shared = script.clone();
    let router =
        axum::Router::new().fallback(move |request: Request| serve(shared.clone(), request));
    (kube::Client::new(router, NS), Apiserver { script })
}

impl Apiserver {
    /// The body of the `i`th request sent (from 0).
    pub fn body(&self, i: usize) -> Value {
        let sent = locked(&self.script).sent.get(i).map(|s| s.body.clone());
        sent.unwrap_or_else(|| panic!("fewer than {} requests were sent", i + 1))
    }

    /// Fails the test if a request was out of script or failed a check, or if a scripted one
    /// never came.
    pub fn done(&self) {
        let script = locked(&self.script);
        let left: Vec<String> = script
            .expected
            .iter()
            .map(|e| format!("{} {}", e.method, e.path))
            .collect();
        let sent: Vec<String> = script
            .sent
            .iter()
            .map(|s| format!("{} {}", s.method, s.path))
            .collect();
        assert!(
            script.wrong.is_empty() && left.is_empty(),
            "wrong: {:#?}\nexpected, never sent: {left:#?}\nsent: {sent:#?}",
            script.wrong
        );
    }
}

async fn serve(script: Arc<Mutex<Script>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let (method, path) = (parts.method, parts.uri.path().to_string());
    let said = format!("{method} {path}");
    let mut script = locked(&script);
    script.sent.push(Sent {
        method: method.clone(),
        path: path.clone(),
        body: body.clone(),
    });
    let Some(next) = script.expected.pop_front() else {
        script.wrong.push(format!("{said}: not in the script"));
        return refusal(500, "Unscripted");
    };
    if next.method != method || next.path != path {
        let wrong = format!("{said}: {} {} was expected", next.method, next.path);
        script.wrong.push(wrong);
        script.expected.push_front(next);
        return refusal(500, "Unscripted");
    }
    for (what, check) in &next.checks {
        if !check(&body) {
            script.wrong.push(format!("{said}: not {what}, in {body}"));
        }
    }
    match next.answer {
        Answer::Object(object) => reply(StatusCode::OK, &object),
        Answer::Echo => reply(StatusCode::OK, &raised(body)),
        Answer::Patched(mut object) => {
            merge(&mut object, &body);
            reply(StatusCode::OK, &raised(object))
        }
        Answer::Refused(code, reason) => refusal(code, reason),
    }
}

fn reply(code: StatusCode, body: &Value) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = code;
    let json = header::HeaderValue::from_static("application/json");
    response.headers_mut().insert(header::CONTENT_TYPE, json);
    response
}

/// An error Status, as the apiserver answers one.
fn refusal(code: u16, reason: &str) -> Response {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("scripted: {reason}"), "reason": reason, "code": code,
    });
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    reply(code, &status)
}

/// `object` with its resourceVersion raised by one, as a write stores it.
fn raised(mut object: Value) -> Value {
    let version = object["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert("resourceVersion".into(), json!((version + 1).to_string()));
    }
    object
}

/// Applies JSON merge patch `patch` (RFC 7386) to `target`.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// What a reconcile runs in: its context, the caches' writing ends, and the Events queued.
pub struct World {
    pub ctx: Arc<Context>,
    writers: Writers,
    events: mpsc::Receiver<(Event, ObjectReference)>,
}

impl World {
    /// A context whose API is `client`, with empty caches and no admission objects (so a lease
    /// that fences no objects is in force).
    pub fn new(client: kube::Client) -> World {
        let (memory, writers) = Memory::new();
        let metrics = Arc::new(Metrics::default());
        let (events, queued) = Events::unpublished(metrics.clone());
        let admission = Admission::new(reflector::store().0, reflector::store().0);
        let ctx = Context {
            kube: Kube {
                client,
                timeout: Duration::from_secs(5),
            },
            memory,
            events,
            metrics,
            admission,
            failures: Default::default(),
            records: Default::default(),
            records_ahead: Default::default(),
            state_namespace: STATE_NS.into(),
            resync: Duration::from_secs(300),
            synced: true.into(),
        };
        World {
            ctx: Arc::new(ctx),
            writers,
            events: queued,
        }
    }

    /// Puts `claim` in the caches as its watch would: the claim cache, the index by lease, and
    /// its heartbeat, last seen to change `silent_for` ago.
    pub fn cache(&mut self, claim: FencedLeaseClaim, silent_for: Duration) {
        let memory = &self.ctx.memory;
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let seen = Instant::now() - silent_for;
        memory
            .heartbeats
            .observe(&uid, beat_of(&claim.spec), None, seen);
        let name = claim.metadata.name.clone().unwrap_or_default();
        let lease = vec![claim.spec.lease_name.clone()];
        memory.claims_by_lease.set(NS, &name, lease);
        let cached = CachedClaim::from(claim);
        self.writers.claims.apply(&watcher::Event::Apply(cached));
    }

    /// The reasons of the Events queued since last asked.
    pub fn events(&mut self) -> Vec<String> {
        let mut reasons = Vec::new();
        while let Ok((event, _)) = self.events.try_recv() {
            reasons.push(event.reason);
        }
        reasons
    }
}

/// Lease `name` of namespace [`NS`] with `spec` (JSON, defaults filled in), as stored at
/// resourceVersion 1, carrying the operator's finalizer.
pub fn lease(name: &str, spec: Value) -> FencedLease {
    let mut lease = FencedLease::new(
        name,
        serde_json::from_value(spec).unwrap_or_else(|e| panic!("a spec: {e}")),
    );
    let meta = &mut lease.metadata;
    meta.namespace = Some(NS.into());
    meta.uid = Some(format!("uid-lease-{name}"));
    meta.resource_version = Some("1".into());
    meta.generation = Some(1);
    meta.finalizers = Some(vec![FINALIZER.into()]);
    lease
}

/// Claim `name` of lease `lease` in namespace [`NS`], created at second `created`, naming no
/// pod, with a heartbeat, as stored at resourceVersion 1.
pub fn claim(name: &str, lease: &str, created: i64) -> FencedLeaseClaim {
    let spec = json!({
        "leaseName": lease,
        "holderIdentity": format!("id-{name}"),
        "renewTime": MicroTime(Timestamp::UNIX_EPOCH),
    });
    let mut claim = FencedLeaseClaim::new(
        name,
        serde_json::from_value(spec).unwrap_or_else(|e| panic!("a spec: {e}")),
    );
    let meta = &mut claim.metadata;
    meta.namespace = Some(NS.into());
    meta.uid = Some(format!("uid-{name}"));
    meta.resource_version = Some("1".into());
    let created = Timestamp::from_second(1_764_000_000 + created).unwrap_or(Timestamp::UNIX_EPOCH);
    meta.creation_timestamp = Some(Time(created));
    claim
}
