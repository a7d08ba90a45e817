//! Step 4a: the grant latency of `--grant-samples` fresh leases created at this size, half of
//! each kind, in the same namespaces, one at a time: the lease, then at once its claim; claim
//! created -> lease Held, as the lease watch sees it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use kube::api::{Api, PostParams};

use super::calls::call;
use super::layout::{Kind, fenced_lease};
use super::{Bench, HALF};
use crate::Res;
use crate::figures::{ms, spread};
use crate::objects::claim;

impl Bench {
    /// Fresh leases, one at a time: the lease, then at once its claim; claim created -> Held.
    pub(super) async fn grants(&mut self, label: &str) -> Res<()> {
        let mut samples = vec![];
        let mut by_kind: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut made = vec![];
        let result = async {
            for i in 0..self.args.grant_samples {
                let (kind, took) = self.fresh_grant(i, &mut made).await?;
                samples.push(took);
                by_kind.entry(kind.name()).or_default().push(took);
            }
            Res::Ok(())
        }
        .await;
        let removed = self.remove_leases(&made, "g-").await;
        result?;
        removed?;
        let kinds: Vec<String> = by_kind
            .iter_mut()
            .map(|(k, v)| {
                let (median, _, worst) = spread(v);
                format!("{k}: median {median:.0} ms, worst {worst:.0} ms")
            })
            .collect();
        self.out.samples(
            label,
            "grant latency, fresh lease (claim created -> lease Held)",
            &samples,
            "ms",
            &format!(
                "{} leases created one at a time beside the others, each lease then at once its claim; Held as a watch on the leases sees it; {}",
                self.args.grant_samples,
                kinds.join("; ")
            ),
        );
        Ok(())
    }

    /// Lease `g-<i>` (its namespace and name added to `made` once created) and its claim: the
    /// lease's kind, and ms from the claim's create to the lease Held.
    async fn fresh_grant(
        &mut self,
        i: usize,
        made: &mut Vec<(String, String)>,
    ) -> Res<(Kind, f64)> {
        // Alternating kinds, over the namespaces.
        let (ns, kind) = if i.is_multiple_of(2) {
            (&self.layout.objects[(i / 2) % HALF], Kind::Objects)
        } else {
            (&self.layout.kinds[(i / 2) % HALF], Kind::Configmaps)
        };
        let ns = ns.clone();
        let name = format!("g-{i}");
        let leases: Api<FencedLease> = Api::namespaced(self.client.clone(), &ns);
        let claims: Api<FencedLeaseClaim> = Api::namespaced(self.client.clone(), &ns);
        let pp = PostParams::default();
        let lease = fenced_lease(&name, kind, &self.layout.run)?;
        call(
            format!("create lease {ns}/{name}"),
            leases.create(&pp, &lease),
        )
        .await?;
        made.push((ns.clone(), name.clone()));
        let claim_name = format!("c-{name}");
        call(
            format!("create claim {ns}/{claim_name}"),
            claims.create(&pp, &claim(&claim_name, &name)),
        )
        .await?;
        let created = Instant::now();
        let held = self
            .leases
            .wait_held(
                &mut self.operator,
                &ns,
                &name,
                &claim_name,
                Duration::from_secs(60),
            )
            .await?;
        Ok((kind, ms(held.saturating_duration_since(created))))
    }
}
