//! Kubernetes objects fenced by the apiserver itself, with ValidatingAdmissionPolicy (CEL) from
//! `deploy/admission/fence-policy.yaml`; no webhook server.
//!
//! An object takes part by carrying the label [`LEASE_LABEL`] (the lease's name) and the
//! annotation [`TOKEN_ANNOTATION`] (the token of its last write). Every write stamps the
//! writer's token ([`stamp`]); the apiserver then refuses it when the token is
//! - lower than the token stored on the object (policy [`OBJECT_POLICY`]): exact, since
//!   admission compares with the stored object in the same storage transaction as the write;
//! - lower than the lease's current token (policy [`LEASE_POLICY`], for a lease with
//!   `spec.fenceObjects: true`): this rule reads the lease from the apiserver's informer cache,
//!   so it can lag a grant by a short window; it also covers objects the new holder has not
//!   written yet.
//!
//! Both rules of the lease, and one more, apply as well to the kinds a lease names in
//! `spec.fence`, which need no label: a writer that authenticates as a pod must be the lease's
//! holder pod, whatever it writes (any verb, any subresource; [`Error::NotHolder`]).
//!
//! A delete carries no body, so a holder deletes with [`delete`]: stamp its token with an
//! update, then delete on the resourceVersion that update returned.
//!
//! ```no_run
//! # async fn demo(configmaps: kube::Api<k8s_openapi::api::core::v1::ConfigMap>, token: i64)
//! # -> Result<(), fenced_lease::fence::Error> {
//! use fenced_lease::fence::{self, kube::stamp};
//! let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
//! cm.metadata.name = Some("payout-42".into());
//! stamp(&mut cm, "dividends", token);
//! match configmaps.create(&Default::default(), &cm).await.map_err(fence::Error::from) {
//!     Err(e) if e.is_fenced() => { /* a newer holder exists: stop */ }
//!     other => { other?; }
//! }
//! # Ok(()) }
//! ```

use std::fmt::Debug;

use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

pub use crate::api::{LEASE_LABEL, TOKEN_ANNOTATION};

use super::{Error, check_token};

/// The cluster-wide policy comparing a write's token with the one stored on the object.
pub const OBJECT_POLICY: &str = "fenced-lease-object-token";
/// The policy of the lease rules (params: the lease): the writer's pod must hold the lease,
/// and a write's token may not be below the lease's current token.
pub const LEASE_POLICY: &str = "fenced-lease-lease-token";

/// Puts `object` under lease `lease`'s fence and stamps it with `token`: sets the label
/// [`LEASE_LABEL`] and the annotation [`TOKEN_ANNOTATION`].
pub fn stamp<K: Resource>(object: &mut K, lease: &str, token: i64) {
    object
        .labels_mut()
        .insert(LEASE_LABEL.to_string(), lease.to_string());
    object
        .annotations_mut()
        .insert(TOKEN_ANNOTATION.to_string(), token.to_string());
}

/// A merge patch that stamps an object (label and annotation), to combine with a change.
pub fn stamp_patch(lease: &str, token: i64) -> serde_json::Value {
    json!({"metadata": {
        "labels": {LEASE_LABEL: lease},
        "annotations": {TOKEN_ANNOTATION: token.to_string()},
    }})
}

/// The token stamped on `object`, if it carries a well-formed one.
pub fn token_of<K: Resource>(object: &K) -> Option<i64> {
    object
        .annotations()
        .get(TOKEN_ANNOTATION)?
        .parse()
        .ok()
        .filter(|t: &i64| *t >= 0)
}

/// Deletes a fenced object as the holder of `token`: stamps the token with an update (which
/// the policies check), then deletes on exactly the version that update wrote, so no write of
/// another holder can come in between.
pub async fn delete<K>(api: &Api<K>, name: &str, lease: &str, token: i64) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    check_token(token)?;
    let stamped = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(stamp_patch(lease, token)),
        )
        .await?;
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: stamped.resource_version(),
            uid: stamped.uid(),
        }),
        ..DeleteParams::default()
    };
    api.delete(name, &params).await?;
    Ok(())
}

/// The two tokens of a fencing refusal by the admission policies, read from its message
/// (`... fencing.dev/token <presented> is lower than <highest>, ...`).
pub fn refusal(error: &kube::Error) -> Option<(i64, i64)> {
    let kube::Error::Api(status) = error else {
        return None;
    };
    if status.code != 403 {
        return None;
    }
    let (_, rest) = status.message.split_once("fenced: ")?;
    let (_, rest) = rest.split_once("fencing.dev/token ")?;
    let (presented, rest) = rest.split_once(" is lower than ")?;
    let highest: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((presented.parse().ok()?, highest.parse().ok()?))
}

/// The identity rule's refusal, from its message (`fenced: <what>: pod <p> does not hold
/// FencedLease <ns>/<lease> (...)...`): what follows `fenced: `.
pub fn not_holder(error: &kube::Error) -> Option<&str> {
    let kube::Error::Api(status) = error else {
        return None;
    };
    let (_, what) = status.message.split_once("fenced: ")?;
    (status.code == 403 && what.contains(" does not hold FencedLease ")).then_some(what)
}

/// A refusal by the fencing policies becomes [`Error::Fenced`] (a lower token) or
/// [`Error::NotHolder`] (a pod that does not hold the lease); anything else [`Error::Kube`].
impl From<kube::Error> for Error {
    fn from(error: kube::Error) -> Self {
        if let Some((presented, highest)) = refusal(&error) {
            return Error::Fenced {
                scope: None,
                presented,
                highest,
            };
        }
        match not_holder(&error) {
            Some(what) => Error::NotHolder(what.to_string()),
            None => Error::Kube(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::core::Status;

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            Status::failure(message, "Forbidden")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn stamp_sets_label_and_token() {
        let mut cm = ConfigMap::default();
        stamp(&mut cm, "dividends", 42);
        assert_eq!(cm.labels()[LEASE_LABEL], "dividends");
        assert_eq!(token_of(&cm), Some(42));
    }

    #[test]
    fn malformed_tokens_are_not_tokens() {
        let mut cm = ConfigMap::default();
        for bad in ["-1", "abc", ""] {
            cm.annotations_mut()
                .insert(TOKEN_ANNOTATION.into(), bad.into());
            assert_eq!(token_of(&cm), None, "{bad:?}");
        }
    }

    #[test]
    fn policy_refusals_become_fenced() {
        let message = "configmaps \"c\" is forbidden: ValidatingAdmissionPolicy 'fenced-lease-object-token' with binding 'fenced-lease-object-token' denied request: fenced: ConfigMap ns/c: fencing.dev/token 6 is lower than 7, the token stored on the object (lease l)";
        let e = Error::from(api_error(403, message));
        assert!(matches!(
            e,
            Error::Fenced {
                presented: 6,
                highest: 7,
                ..
            }
        ));
    }

    #[test]
    fn identity_refusals_become_not_holder() {
        let message = "configmaps \"c\" is forbidden: ValidatingAdmissionPolicy 'fenced-lease-lease-token' with binding 'fenced-lease.ns.l' denied request: fenced: ConfigMap ns/c: pod pa does not hold FencedLease ns/l (pod pb holds it); only the holder's pod may write what the lease fences";
        let e = Error::from(api_error(403, message));
        assert!(e.is_fenced());
        assert!(
            matches!(&e, Error::NotHolder(what) if what.starts_with("ConfigMap ns/c: pod pa does not hold")),
            "{e:?}"
        );
    }

    #[test]
    fn other_refusals_stay_api_errors() {
        let e = Error::from(api_error(403, "configmaps is forbidden: User cannot"));
        assert!(matches!(e, Error::Kube(_)));
        let e = Error::from(api_error(
            422,
            "fenced: x: fencing.dev/token 1 is lower than 2",
        ));
        assert!(matches!(e, Error::Kube(_)));
    }
}
