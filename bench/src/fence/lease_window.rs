//! The lease rule's window: a lease's new token written (its status write answered) -> a
//! write carrying the previous token refused by the apiserver. The token is raised by a status
//! write as the admin, exactly the write a grant is; probes are dry-run creates of a ConfigMap
//! labelled with the lease and stamped with a token.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use fenced_lease::api::{FencedLease, LEASE_LABEL, TOKEN_ANNOTATION};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Log, in_namespace, report};
use crate::figures::{Results, ms};
use crate::objects::dry_run;
use crate::writers::until;
use crate::{Res, fail};

/// The fenceObjects lease `bench` of a namespace, and the ConfigMaps it fences.
struct TokenRule {
    leases: Api<FencedLease>,
    configmaps: Api<ConfigMap>,
}

impl TokenRule {
    /// A dry-run create of ConfigMap `probe`, labelled with the lease and stamped with
    /// `token`: whether the apiserver refused it.
    async fn refused(&self, token: i64) -> Res<bool> {
        let probe = ConfigMap {
            metadata: ObjectMeta {
                name: Some("probe".into()),
                labels: Some(BTreeMap::from([(LEASE_LABEL.into(), "bench".into())])),
                annotations: Some(BTreeMap::from([(
                    TOKEN_ANNOTATION.into(),
                    token.to_string(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        match self.configmaps.create(&dry_run(), &probe).await {
            Ok(_) => Ok(false),
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    /// The lease's token set to `token`, as a grant's status write sets it.
    async fn set_token(&self, token: i64) -> kube::Result<FencedLease> {
        let status = Patch::Merge(json!({"status": {"fencingToken": token}}));
        self.leases
            .patch_status("bench", &PatchParams::default(), &status)
            .await
    }
}

pub(super) async fn lease_window(
    client: &Client,
    samples: usize,
    log: &mut Log,
    results: &Results,
) -> Res<()> {
    in_namespace(client, |ns| async move {
        measure_window(client, &ns, samples, log, results).await
    })
    .await
}

async fn measure_window(
    client: &Client,
    ns: &str,
    samples: usize,
    log: &mut Log,
    results: &Results,
) -> Res<()> {
    let rule = TokenRule {
        leases: Api::namespaced(client.clone(), ns),
        configmaps: Api::namespaced(client.clone(), ns),
    };
    let lease: FencedLease = serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": "bench"}, "spec": {"fenceObjects": true},
    }))?;
    // Labelled objects are fenced by deploy/admission/'s binding fenced-lease-objects.
    rule.leases.create(&PostParams::default(), &lease).await?;
    // Warm up: the binding and the lease reach admission through informers.
    rule.set_token(1).await?;
    let warm = Instant::now();
    while !rule.refused(0).await? {
        if warm.elapsed() > Duration::from_secs(30) {
            return fail("the lease rule was not in force within 30s");
        }
    }
    let mut windows = Vec::with_capacity(samples);
    let mut first_probe_refused = 0usize;
    for token in 2..2 + samples as i64 {
        let before = Instant::now();
        if rule.refused(token - 1).await? {
            return fail(format!(
                "token {} refused before the lease moved on",
                token - 1
            ));
        }
        let sent = Instant::now();
        rule.set_token(token).await?;
        let written = Instant::now();
        let gave_up = |_| "a write was still accepted 30s after the grant".to_string();
        let (window, probes) = until(
            written,
            Duration::from_secs(30),
            || rule.refused(token - 1),
            gave_up,
        )
        .await?;
        first_probe_refused += usize::from(probes == 1);
        writeln!(
            log,
            "lease\t{}\t{:.3}\t{probes}\t{:.3}\t{:.3}",
            token - 1,
            ms(window),
            ms(written - sent),
            ms(sent - before)
        )?;
        windows.push(window);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let note = format!(
        "the first probe sent after the grant's write was answered was already refused in {first_probe_refused} of {samples}"
    );
    let what = "lease rule: grant written -> lower token refused";
    report(results, "token rule", what, &windows, &note);
    Ok(())
}
