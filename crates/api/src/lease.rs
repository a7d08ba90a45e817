//! `FencedLease`: the lock. Users write its spec; only the operator writes its status.
// kube's derive takes one `printcolumn(...)` per column; clippy reads their repeated
// `type_ = ...` keys as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, MicroTime};
use kube::core::Rule;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{MAX_LEASE_NAME_LEN, MAX_MIN_TOKEN, duration_from_seconds};

/// Desired behaviour of a fenced lease.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "fencing.dev",
    version = "v1alpha1",
    kind = "FencedLease",
    plural = "fencedleases",
    shortname = "flease",
    category = "fencing",
    namespaced,
    status = "FencedLeaseStatus",
    doc = "A lease with a fencing token: at most one holder at a time, and every grant carries a token larger than all earlier ones.",
    printcolumn(name = "Holder", type_ = "string", json_path = ".status.holder.identity", description = "Identity of the current holder"),
    printcolumn(name = "Token", type_ = "integer", json_path = ".status.fencingToken", description = "Last fencing token issued"),
    printcolumn(name = "Follows", type_ = "string", json_path = ".spec.follow.lease", description = "The coordination.k8s.io Lease whose holder holds this lease", priority = 1),
    printcolumn(name = "Waiting", type_ = "integer", json_path = ".status.waiting", description = "Claims waiting for the lease"),
    printcolumn(name = "Duration", type_ = "integer", json_path = ".spec.leaseDurationSeconds", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = lease_name_rule(),
    validation = Rule::new(
        "!has(oldSelf.status) || !has(oldSelf.status.fencingToken) || (has(self.status) && has(self.status.fencingToken) && self.status.fencingToken >= oldSelf.status.fencingToken)"
    ).message("status.fencingToken can never be lowered or removed: a fencing token is issued at most once"),
)]
#[serde(rename_all = "camelCase")]
pub struct FencedLeaseSpec {
    /// Seconds a holder keeps the lease after the operator last saw its heartbeat change.
    #[serde(default = "default_lease_duration_seconds")]
    #[schemars(range(min = 1, max = 3600))]
    pub lease_duration_seconds: i32,

    /// Floor for the next token: it is greater than both the last token and this value.
    /// Raise it after restoring the protected resource from a backup. At most 2^52
    /// (4503599627370496): tokens stay below 2^53, which every fence compares exactly.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_MIN_TOKEN))]
    pub min_token: i64,

    /// Annotate the holder's pod with `token.fencing.dev/<lease name>: <token>`.
    #[serde(default = "default_true")]
    pub annotate_holder_pod: bool,

    /// Have the apiserver refuse writes to objects labelled `fencing.dev/lease=<this lease>`
    /// whose `fencing.dev/token` annotation is below this lease's current token, or written by
    /// a pod that does not hold it (deploy/admission/fence-policy.yaml's binding
    /// `fenced-lease-objects` reads this field).
    #[serde(default)]
    pub fence_objects: bool,

    /// Refuse writers that are not pods, too, for what this lease fences (`spec.fence`,
    /// `spec.fenceObjects`): people, CI, ServiceAccount tokens bound to no pod (minted with
    /// `serviceaccounts/token`, legacy token Secrets). Only the holder's pod, identities a
    /// Role rule naming the verb `override` on this lease allows, and the control plane's own
    /// controllers write then. Off by default: writers that are not pods meet only the token
    /// rule.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub only_holder_writes: bool,

    /// Kinds of objects in the lease's namespace that only the lease's holder may write,
    /// without labelling or stamping them: the apiserver refuses every write to them (any
    /// verb, any subresource) by a pod that is not the holder's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<FenceSpec>,

    /// Follow a `coordination.k8s.io/v1` Lease of this namespace (the one a controller's
    /// leader election writes): its holder is this lease's holder, and claims are not
    /// granted. Each change of the Lease's holder issues a new token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow: Option<FollowSpec>,
}

/// The coordination Lease a FencedLease follows (`spec.follow`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FollowSpec {
    /// Name of the `coordination.k8s.io/v1` Lease, in the FencedLease's namespace. Its
    /// `holderIdentity` names the holder: the pod of that name, or of the part before the
    /// first `_` (`<hostname>_<uuid>`, as controller-runtime writes it).
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub lease: String,
}

/// The objects a lease fences by kind (`spec.fence`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FenceSpec {
    /// The kinds fenced, in the lease's namespace, every subresource (`status`, `scale`, ...)
    /// included: at most 8, each one its author may update and delete there.
    #[schemars(length(min = 1, max = 8))]
    pub resources: Vec<FencedResource>,

    /// Only the objects whose labels match (every object of the kinds when absent). A
    /// subresource other than `status` (`scale`, `eviction`, ...) is sent without the object's
    /// labels, so it is fenced for every object of the kind, selector or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "fence_selector_schema")]
    pub selector: Option<LabelSelector>,
}

/// A label value: at most 63 characters, alphanumerics and `-_.` inside.
const LABEL_VALUE: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";
/// A label key: an optional DNS-subdomain prefix and `/`, then a name as a label value.
const LABEL_KEY: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";

/// The schema of `spec.fence.selector`: a LabelSelector whose operators, keys and values the
/// apiserver checks at admission (a selector it would refuse in a policy must never reach
/// one), with bounds that keep its CEL rule cheap.
fn fence_selector_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Only the objects whose labels match (every object of the kinds when absent). A subresource other than `status` (`scale`, `eviction`, ...) is sent without the object's labels, so it is fenced for every object of the kind, selector or not.",
        "nullable": true,
        "type": "object",
        "properties": {
            "matchLabels": {
                "description": "Labels the object must carry, each with this value.",
                "type": "object",
                "maxProperties": 16,
                "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE},
            },
            "matchExpressions": {
                "description": "Requirements on the object's labels, all of which must hold.",
                "type": "array",
                "maxItems": 16,
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {"type": "string", "maxLength": 317, "pattern": LABEL_KEY},
                        "operator": {"type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                        "values": {
                            "type": "array",
                            "maxItems": 64,
                            "items": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE},
                        },
                    },
                    "x-kubernetes-validations": [{
                        "rule": "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
                        "message": "values must be non-empty with operator In or NotIn, and empty with Exists or DoesNotExist",
                    }],
                },
            },
        },
    })
}

/// A kind of object, named as in RBAC rules.
#[derive(
    Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, KubeSchema,
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.group != 'fencing.dev'").message(
        "objects of group fencing.dev cannot be fenced: holders and the operator must always reach their leases and claims"
    ),
    validation = Rule::new("!(self.group == 'coordination.k8s.io' && self.resource == 'leases')").message(
        "coordination.k8s.io leases cannot be fenced: every controller's leader election and the nodes' heartbeats write them (follow a Lease instead of fencing it)"
    ),
    validation = Rule::new("!(self.resource == 'events' && self.group in ['', 'events.k8s.io'])").message(
        "events cannot be fenced: every component of the cluster records them"
    ),
    validation = Rule::new("!(self.group in ['authorization.k8s.io', 'authentication.k8s.io'])").message(
        "access reviews (authorization.k8s.io, authentication.k8s.io) cannot be fenced: they are how clients ask what they may do"
    ),
)]
pub struct FencedResource {
    /// API group: `""` (the core group), `apps`, `batch`, ...
    #[serde(default)]
    #[schemars(
        length(max = 253),
        regex(pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$")
    )]
    pub group: String,

    /// Resource, plural and lower case: `deployments`, `configmaps`, `jobs`.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub resource: String,
}

/// A lease's name fits the name part of its token's annotation key.
fn lease_name_rule() -> Rule {
    Rule::new(format!("self.metadata.name.size() <= {MAX_LEASE_NAME_LEN}")).message(
        format!("FencedLease names are limited to {MAX_LEASE_NAME_LEN} characters: the name becomes the name part of the holder pod's annotation key token.fencing.dev/<name>").as_str(),
    )
}

fn default_lease_duration_seconds() -> i32 {
    15
}

fn default_true() -> bool {
    true
}

impl FencedLease {
    /// Seconds of the term in force: the running term's (`status.leaseDurationSeconds`, fixed
    /// at its grant) if set, else `spec.leaseDurationSeconds`.
    pub fn term_seconds(&self) -> i32 {
        self.status
            .as_ref()
            .map_or(self.spec.lease_duration_seconds, |s| {
                s.term_seconds(&self.spec)
            })
    }

    /// The term in force (see [`term_seconds`](Self::term_seconds)).
    pub fn term(&self) -> Duration {
        duration_from_seconds(self.term_seconds())
    }
}

impl FencedLeaseSpec {
    /// `leaseDurationSeconds`: the duration of the next term.
    pub fn lease_duration(&self) -> Duration {
        duration_from_seconds(self.lease_duration_seconds)
    }
}

impl FencedLeaseStatus {
    /// The running term's duration (`leaseDurationSeconds`, fixed at its grant), if set.
    pub fn term_duration(&self) -> Option<Duration> {
        self.lease_duration_seconds.map(duration_from_seconds)
    }

    /// Seconds of the term in force on a lease with this status and `spec`: this status's
    /// `leaseDurationSeconds` if set, else the spec's.
    pub fn term_seconds(&self, spec: &FencedLeaseSpec) -> i32 {
        self.lease_duration_seconds
            .unwrap_or(spec.lease_duration_seconds)
    }
}

/// Observed state, written only by the operator. The source of truth for who holds the lease.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FencedLeaseStatus {
    /// The claim that holds the lease now, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<LeaseHolder>,

    /// The last token issued for this lease (0 before the first grant). Never goes down.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub fencing_token: i64,

    /// When the current holder was granted the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquire_time: Option<MicroTime>,

    /// Duration of the running term, fixed when it was granted: a change of
    /// `spec.leaseDurationSeconds` applies from the next grant, never to a running term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration_seconds: Option<i32>,

    /// How many times the lease changed hands.
    #[serde(default)]
    pub lease_transitions: i64,

    /// Claims waiting for the lease.
    #[serde(default)]
    pub waiting: i32,

    /// Standard conditions (`Held`, `Degraded`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,

    /// The spec generation this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Who holds a lease. Every field has a default so that an object written under an older
/// schema still deserializes (one unreadable object must not stop the operator's watch).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct LeaseHolder {
    /// Name of the holding `FencedLeaseClaim`, in the lease's namespace (empty for the
    /// holder of a followed Lease).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub claim: String,
    /// UID of that claim: a new claim of the same name is a different candidate.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub claim_uid: String,
    /// The claim's `holderIdentity`, or the followed Lease's.
    pub identity: String,
    /// The claim's `podName`, if it names a pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// UID of that pod when it was granted: a pod of the same name with another UID (a
    /// replacement) never inherits the hold or the token annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// For a lease that follows a coordination Lease (`spec.follow`): the term of that Lease
    /// this holder was taken from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<FollowedTerm>,
}

/// A term of a followed coordination Lease: the Lease object and how many times it had
/// changed hands. A new object (deleted and created again), another count, another holder
/// identity or another pod is another term, and gets a new token.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct FollowedTerm {
    /// The Lease's name.
    pub name: String,
    /// The Lease's UID.
    pub uid: String,
    /// Its `spec.leaseTransitions` (0 when unset).
    pub lease_transitions: i64,
}
