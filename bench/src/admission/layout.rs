//! The run's objects and where they go: the two kinds of fenced lease, the ConfigMaps written,
//! and the namespaces of a run.

use std::collections::BTreeMap;

use fenced_lease::api::FencedLease;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;

use super::{HALF, RUN_LABEL};
use crate::Res;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Kind {
    /// `spec.fenceObjects: true`
    Objects,
    /// `spec.fence: {resources: [{resource: configmaps}]}`
    Configmaps,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Objects => "fenceObjects",
            Kind::Configmaps => "spec.fence configmaps",
        }
    }
}

pub(super) fn fenced_lease(name: &str, kind: Kind, run: &str) -> Res<FencedLease> {
    let mut spec = json!({"leaseDurationSeconds": 3600, "annotateHolderPod": false});
    match kind {
        Kind::Objects => spec["fenceObjects"] = json!(true),
        Kind::Configmaps => spec["fence"] = json!({"resources": [{"resource": "configmaps"}]}),
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": name, "labels": {RUN_LABEL: run}},
        "spec": spec,
    }))?)
}

pub(super) fn configmap(
    name: &str,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> ConfigMap {
    let map = |pairs: &[(&str, &str)]| {
        (!pairs.is_empty()).then(|| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        })
    };
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            labels: map(labels),
            annotations: map(annotations),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("n".to_string(), "0".to_string())])),
        ..Default::default()
    }
}

/// The namespaces of a run: `<run>-fo-NN` (fenceObjects leases), `<run>-k-NN` (leases fencing
/// configmaps), `<run>-free` (no lease: the unfenced writes), `<run>-op` (the operator's own
/// records), `<run>-i11` (the two writer pods and the hand-over lease).
pub(super) struct Layout {
    pub(super) run: String,
    pub(super) objects: Vec<String>,
    pub(super) kinds: Vec<String>,
    pub(super) free: String,
    pub(super) operator: String,
    pub(super) i11: String,
}

impl Layout {
    pub(super) fn new(run: &str) -> Self {
        Layout {
            run: run.to_string(),
            objects: (0..HALF).map(|i| format!("{run}-fo-{i:02}")).collect(),
            kinds: (0..HALF).map(|i| format!("{run}-k-{i:02}")).collect(),
            free: format!("{run}-free"),
            operator: format!("{run}-op"),
            i11: format!("{run}-i11"),
        }
    }

    pub(super) fn all(&self) -> Vec<String> {
        let mut all = self.objects.clone();
        all.extend(self.kinds.iter().cloned());
        all.extend([self.free.clone(), self.operator.clone(), self.i11.clone()]);
        all
    }

    /// Lease `i` of the N: its namespace and kind (alternating over the 100 namespaces).
    pub(super) fn place(&self, i: usize) -> (&str, Kind) {
        let j = i % (2 * HALF);
        if j < HALF {
            (&self.objects[j], Kind::Objects)
        } else {
            (&self.kinds[j - HALF], Kind::Configmaps)
        }
    }
}
