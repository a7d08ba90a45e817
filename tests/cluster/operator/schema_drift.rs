//! I8 under schema drift: a FencedLease stored under another schema, which the operator
//! cannot read, is reported (Warning Event) and ignored; every other lease keeps working.
//! A test binary of its own: it changes the CRD for a moment, so nothing else may run beside
//! it (cargo runs test binaries one after another).

use crate::common;

use std::time::Duration;

use common::operator::OperatorProcess;
use common::{TestNamespace, control_plane, wait_for};
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn i8_an_unreadable_lease_is_reported_and_the_others_keep_working() {
    let ns = TestNamespace::new("schema-drift").await;
    let cp = control_plane();

    // Loosen the schema, store a lease the real schema would refuse, restore the schema.
    let loosen = r#"[{"op": "replace", "path": "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/leaseDurationSeconds", "value": {"type": "string"}}]"#;
    let out = cp
        .kubectl_cmd()
        .args([
            "patch",
            "crd",
            "fencedleases.fencing.dev",
            "--type=json",
            "-p",
            loosen,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let drifted = "apiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata:\n  name: drifted\nspec:\n  leaseDurationSeconds: \"soon\"\n";
    wait_for("the loosened schema to accept a string", WAIT, || async {
        let out = ns.kubectl_apply(drifted);
        out.status.success().then_some(())
    })
    .await;
    cp.install_crds();

    let op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("fine", 15);
    ns.create_claim("c", "fine", None).await;
    assert!(wait_for("the readable lease granted", WAIT, || ns.granted_token("c")).await > 0);

    let warning = wait_for("a Warning Event on the unreadable lease", WAIT, || async {
        let events = ns
            .api::<Event>()
            .list(&ListParams::default())
            .await
            .ok()?
            .items;
        events.into_iter().find(|e| {
            e.reason.as_deref() == Some("UnreadableObject")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("drifted")
        })
    })
    .await;
    assert!(
        warning.note.unwrap_or_default().contains("cannot read"),
        "the Event says why"
    );
    assert!(
        op.log_text().contains("cannot read object"),
        "{}",
        op.log_text()
    );
}
