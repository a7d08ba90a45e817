//! Step 3: write latencies, as cluster-admin over one keep-alive connection of their own, in
//! interleaved rounds so that any drift of the machine hits every kind alike: ConfigMaps
//! created, updated and deleted in a namespace no lease touches; a labelled ConfigMap stamped
//! with its lease's current token updated under a fenceObjects lease; ConfigMaps created,
//! updated and deleted in a namespace fenced by kind. Every one must be accepted.

use std::time::{Duration, Instant};

use fenced_lease::api::{FencedLease, LEASE_LABEL, TOKEN_ANNOTATION};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::calls::{call, delete_quietly, timed};
use super::layout::configmap;
use super::{Bench, HALF};
use crate::Res;

/// The figures of a round, in the order written.
const WRITES: [&str; 7] = [
    "unfenced ConfigMap create",
    "unfenced ConfigMap update",
    "unfenced ConfigMap delete",
    "fenceObjects ConfigMap update (labelled, stamped)",
    "spec.fence ConfigMap create",
    "spec.fence ConfigMap update",
    "spec.fence ConfigMap delete",
];

/// Lease l-0, a fenceObjects lease of the first namespace, whose token `fo-target` carries.
const TARGET_LEASE: &str = "l-0";

/// Where the rounds write, as the writer's client: the namespace no lease touches, the first
/// of fenceObjects leases, the first of leases fencing configmaps; and the token stamped.
struct Targets {
    free: Api<ConfigMap>,
    objects: Api<ConfigMap>,
    kinds: Api<ConfigMap>,
    token: String,
}

impl Bench {
    /// The write latencies: rounds of every kind, interleaved.
    pub(super) async fn writes(&mut self, n: usize, label: &str) -> Res<()> {
        let targets = self.targets(n).await?;
        let started = Instant::now();
        let samples = self.rounds(&targets).await?;
        let took = started.elapsed();
        let notes = self.notes(n, &targets.token, took);
        for ((name, values), note) in WRITES.iter().zip(&samples).zip(&notes) {
            self.out.samples(label, name, values, "ms", note);
        }
        call(
            "delete fo-target",
            targets
                .objects
                .delete("fo-target", &DeleteParams::default()),
        )
        .await?;
        Ok(())
    }

    /// The objects updated in every round, made afresh at every size: `u-target` and
    /// `k-target`, and `fo-target` stamped with lease l-0's current token.
    async fn targets(&self, n: usize) -> Res<Targets> {
        let free: Api<ConfigMap> = Api::namespaced(self.writer.clone(), &self.layout.free);
        let objects_ns = &self.layout.objects[0];
        let kinds_ns = &self.layout.kinds[0];
        let objects: Api<ConfigMap> = Api::namespaced(self.writer.clone(), objects_ns);
        let kinds: Api<ConfigMap> = Api::namespaced(self.writer.clone(), kinds_ns);
        let token = if n > 0 {
            let leases: Api<FencedLease> = Api::namespaced(self.client.clone(), objects_ns);
            let lease = call("get lease l-0", leases.get(TARGET_LEASE)).await?;
            lease.status.map_or(0, |s| s.fencing_token)
        } else {
            1
        };
        let token = token.to_string();
        let pp = PostParams::default();
        for (api, name) in [(&free, "u-target"), (&kinds, "k-target")] {
            delete_quietly(api, name).await?;
            call(
                format!("create {name}"),
                api.create(&pp, &configmap(name, &[], &[])),
            )
            .await?;
        }
        let labelled = configmap(
            "fo-target",
            &[(LEASE_LABEL, TARGET_LEASE)],
            &[(TOKEN_ANNOTATION, &token)],
        );
        if call("create fo-target", objects.create(&pp, &labelled))
            .await
            .is_err()
        {
            // Left from an earlier size, carrying a lower token: stamp the current one.
            let patch = json!({"metadata": {"annotations": {TOKEN_ANNOTATION: &token}}});
            call(
                "stamp fo-target",
                objects.patch("fo-target", &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await?;
        }
        Ok(Targets {
            free,
            objects,
            kinds,
            token,
        })
    }

    /// `--warmup` rounds, then `--samples` counted: each of [`WRITES`] in turn. The samples of
    /// each, ms.
    async fn rounds(&self, t: &Targets) -> Res<Vec<Vec<f64>>> {
        let mut samples: Vec<Vec<f64>> = vec![vec![]; WRITES.len()];
        let (pp, merge, dp) = (
            PostParams::default(),
            PatchParams::default(),
            DeleteParams::default(),
        );
        for round in 0..self.args.warmup + self.args.samples {
            let mut took = [0.0; 7];
            let patch = Patch::Merge(json!({"data": {"n": round.to_string()}}));
            let stamped = Patch::Merge(json!({
                "metadata": {"annotations": {TOKEN_ANNOTATION: &t.token}},
                "data": {"n": round.to_string()},
            }));
            let name = format!("w-{round}");
            let fresh = configmap(&name, &[], &[]);
            took[0] = timed(WRITES[0], t.free.create(&pp, &fresh)).await?;
            took[1] = timed(WRITES[1], t.free.patch("u-target", &merge, &patch)).await?;
            took[2] = timed(WRITES[2], t.free.delete(&name, &dp)).await?;
            took[3] = timed(WRITES[3], t.objects.patch("fo-target", &merge, &stamped)).await?;
            took[4] = timed(WRITES[4], t.kinds.create(&pp, &fresh)).await?;
            took[5] = timed(WRITES[5], t.kinds.patch("k-target", &merge, &patch)).await?;
            took[6] = timed(WRITES[6], t.kinds.delete(&name, &dp)).await?;
            if round >= self.args.warmup {
                for (s, t) in samples.iter_mut().zip(took) {
                    s.push(t);
                }
            }
        }
        Ok(samples)
    }

    /// The note of each of [`WRITES`]: where it was written, and how the rounds went (`took`).
    fn notes(&self, n: usize, token: &str, took: Duration) -> [String; 7] {
        let (free, objects_ns, kinds_ns) = (
            &self.layout.free,
            &self.layout.objects[0],
            &self.layout.kinds[0],
        );
        let per_ns = n / (2 * HALF);
        let rounds = format!(
            "{} rounds of 7 writes, interleaved ({} s in all), after {} not counted; cluster-admin over one keep-alive HTTP/2 connection",
            self.args.samples,
            took.as_secs().max(1),
            self.args.warmup
        );
        [
            format!("namespace {free} (no lease); {rounds}"),
            format!("namespace {free} (no lease), one object; {rounds}"),
            format!("namespace {free} (no lease); {rounds}"),
            format!(
                "namespace {objects_ns} ({per_ns} fenceObjects leases), labelled {LEASE_LABEL}={TARGET_LEASE}, stamped with its current token {token}, accepted; {rounds}"
            ),
            format!(
                "namespace {kinds_ns} ({per_ns} leases fencing configmaps by kind), unstamped, accepted; {rounds}"
            ),
            format!(
                "namespace {kinds_ns} ({per_ns} leases fencing configmaps by kind), one object, unstamped, accepted; {rounds}"
            ),
            format!(
                "namespace {kinds_ns} ({per_ns} leases fencing configmaps by kind), accepted; {rounds}"
            ),
        ]
    }
}
