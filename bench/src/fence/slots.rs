//! The kinds slots of `deploy/admission/fence-kinds.yaml`: the identity window's namespace
//! listed in the slot of its kind, as the operator would list it (so that no operator is
//! needed), and unlisted when done.

use fenced_lease::api::FencedResource;
use fenced_lease_operator::admission::shipped::{self, Assignment};
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use kube::Client;
use kube::api::{Api, PostParams};

use crate::Res;

/// Lists namespace `ns` for `kind` in a kinds slot: the one of the kind, or a free one.
pub(super) async fn list(client: &Client, ns: &str, kind: &FencedResource) -> Res<()> {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let mut free = None;
    for (i, name) in shipped::slot_names().iter().enumerate() {
        let policy = policies.get(name).await?;
        match shipped::assignment(&policy) {
            Ok(Some(mut a)) if a.kind == *kind => {
                a.namespaces.insert(ns.to_string());
                return write_slot(&policies, i, policy, Some(&a)).await;
            }
            Ok(None) => free = free.or(Some((i, policy))),
            _ => {}
        }
    }
    let (i, policy) = free.ok_or("no free kinds slot (deploy/admission/fence-kinds.yaml)")?;
    let a = Assignment {
        kind: kind.clone(),
        namespaces: [ns.to_string()].into(),
    };
    write_slot(&policies, i, policy, Some(&a)).await
}

/// Takes namespace `ns` out of every kinds slot.
pub(super) async fn unlist(client: &Client, ns: &str) -> Res<()> {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    for (i, name) in shipped::slot_names().iter().enumerate() {
        let policy = policies.get(name).await?;
        if let Ok(Some(mut a)) = shipped::assignment(&policy)
            && a.namespaces.remove(ns)
        {
            let a = Some(&a).filter(|a| !a.namespaces.is_empty());
            write_slot(&policies, i, policy, a).await?;
        }
    }
    Ok(())
}

async fn write_slot(
    policies: &Api<ValidatingAdmissionPolicy>,
    i: usize,
    mut stored: ValidatingAdmissionPolicy,
    assigned: Option<&Assignment>,
) -> Res<()> {
    stored.spec = shipped::slot_policy(i, assigned)?.spec;
    let name = shipped::slot_name(i);
    policies
        .replace(&name, &PostParams::default(), &stored)
        .await?;
    Ok(())
}
