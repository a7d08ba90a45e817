//! Faults an administrator causes to leases: re-created (with or without their token records),
//! their duration lowered, deleted with the finalizer stripped.

use super::*;

impl Nemesis<'_> {
    /// Deletes a lease and creates it again; with `records`, the operator's token records
    /// are deleted in between (a GitOps prune of its namespace).
    pub(super) async fn recreate_lease(&mut self, records: bool) {
        let kind = if records {
            FaultKind::DeleteTokenRecords
        } else {
            FaultKind::RecreateLease
        };
        let (lease, duration) = LEASES[self.rng.random_range(0..LEASES.len())];
        let ns = &self.cluster.ns;
        let target = self.held(false).await.filter(|t| t.lease == lease);
        self.start_on(
            kind,
            format!(
                "delete lease {lease}{}, create it again",
                if records {
                    ", delete the operator's token records"
                } else {
                    ""
                }
            ),
            target,
            Some(lease.to_string()),
        );
        let api = ns.api::<FencedLease>();
        let _ = api.delete(lease, &DeleteParams::default()).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while tokio::time::Instant::now() < deadline
            && !matches!(api.get_opt(lease).await, Ok(None))
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut deleted = vec![];
        if records {
            let cms = ns.api::<ConfigMap>();
            if let Ok(list) = cms.list(&ListParams::default()).await {
                for cm in list {
                    let name = cm.metadata.name.unwrap_or_default();
                    if name.starts_with("fenced-lease-tokens.")
                        && cms.delete(&name, &DeleteParams::default()).await.is_ok()
                    {
                        deleted.push(name);
                    }
                }
            }
        }
        create_lease(ns, lease, duration).await;
        self.end(
            kind,
            format!("lease {lease} re-created; records deleted: {deleted:?}"),
        );
    }

    pub(super) async fn lower_duration(&mut self) {
        let kind = FaultKind::LowerDuration;
        let target = self
            .held(false)
            .await
            .filter(|t| Cluster::term_of(&t.lease) > 1);
        let (lease, base) = match &target {
            Some(t) => (t.lease.clone(), Cluster::term_of(&t.lease)),
            None => ("c".to_string(), Cluster::term_of("c")),
        };
        let api = self.cluster.ns.api::<FencedLease>();
        let patch = |d: u64| Patch::Merge(serde_json::json!({"spec": {"leaseDurationSeconds": d}}));
        self.start_on(
            kind,
            format!(
                "lease {lease}: leaseDurationSeconds {base} -> 1 while held{}",
                target
                    .as_ref()
                    .map(|t| format!(" by {} (token {})", t.process, t.token))
                    .unwrap_or_default()
            ),
            target,
            Some(lease.clone()),
        );
        let lowered = api.patch(&lease, &PatchParams::default(), &patch(1)).await;
        let keep = self.secs(2.0 * base as f64 + 1.0, 2.0 * base as f64);
        tokio::time::sleep(keep).await;
        let restored = api
            .patch(&lease, &PatchParams::default(), &patch(base))
            .await;
        self.end(
            kind,
            format!(
                "lease {lease}: back to {base} s after {keep:?} (lowered: {}, restored: {})",
                lowered.is_ok(),
                restored.is_ok()
            ),
        );
    }

    /// Deletes a lease with its finalizer stripped, as an administrator does to a lease stuck
    /// in deletion (issue 38, item 5): a merge patch `metadata.finalizers: null`, then the
    /// delete (and the strip again if the operator put its finalizer back in between). While
    /// the lease is gone, what it fenced is written as cluster-admin and as a pod that holds
    /// nothing (no existing lease fences it: [`crate::collateral`]); the operator's admission
    /// objects of the lease are watched for (its delete event removes them); then the lease is
    /// created again. Any lease, `d` (Secrets, with a selector) included.
    pub(super) async fn strip_finalizer(&mut self) {
        let kind = FaultKind::StripFinalizer;
        let leases = all_leases();
        let (lease, duration) = leases[self.rng.random_range(0..leases.len())];
        let ns = &self.cluster.ns;
        let target = if lease == FENCE_ONLY {
            None
        } else {
            self.held(false).await.filter(|t| t.lease == lease)
        };
        self.start_on(
            kind,
            format!(
                "lease {lease}: finalizers stripped, deleted; what it fenced written while it is gone; created again"
            ),
            target,
            Some(lease.to_string()),
        );
        let api = ns.api::<FencedLease>();
        let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        let pp = PatchParams::default();
        let mut how = match api.patch(lease, &pp, &strip).await {
            Ok(_) => "stripped, then deleted".to_string(),
            Err(e) => format!("the strip failed ({e}), deleted"),
        };
        if let Err(e) = api.delete(lease, &DeleteParams::default()).await {
            how.push_str(&format!(" (the delete failed: {e})"));
        }
        let started = tokio::time::Instant::now();
        let mut gone_after = None;
        while started.elapsed() < Duration::from_secs(30) {
            let (gone, finalized) = match api.get_opt(lease).await {
                Ok(None) => (true, false),
                Ok(Some(l)) => (false, l.metadata.finalizers.is_some_and(|f| !f.is_empty())),
                Err(_) => (false, false),
            };
            if gone {
                gone_after = Some(started.elapsed());
                break;
            }
            // The operator put its finalizer back before the delete: strip it again.
            if finalized && api.patch(lease, &pp, &strip).await.is_ok() {
                how = "stripped, deleted; its finalizer was back, stripped again".into();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let collateral = self.cluster.collateral.clone();
        let written = match gone_after {
            Some(_) => Some(collateral.write_gone(&self.rec, lease, 3).await),
            None => None,
        };
        let left = self
            .admission_objects_left(lease, Duration::from_secs(10))
            .await;
        create_lease(ns, lease, duration).await;
        self.end(
            kind,
            format!(
                "lease {lease}: {how}; gone after {gone_after:?}; written while gone (accepted / refused / no answer): {}; its admission objects: {left}; created again",
                written.map_or("-".into(), |w| format!(
                    "{} / {} / {}",
                    w.accepted, w.refused, w.failed
                )),
            ),
        );
    }

    /// Waits up to `within` for the kinds slots to stop listing the namespace for the kinds
    /// only lease `lease`, which is gone, fenced there; says how long it took, or what is left.
    async fn admission_objects_left(&self, lease: &str, within: Duration) -> String {
        let kinds = |name: &str| -> Vec<(String, String)> {
            let fence = fence_of(name);
            let resources = fence["resources"].as_array().cloned().unwrap_or_default();
            resources
                .iter()
                .map(|r| {
                    let field = |f: &str| r[f].as_str().unwrap_or_default().to_string();
                    (field("group"), field("resource"))
                })
                .collect()
        };
        let others: Vec<_> = all_leases()
            .into_iter()
            .filter(|(l, _)| *l != lease)
            .flat_map(|(l, _)| kinds(l))
            .collect();
        let alone: Vec<_> = kinds(lease)
            .into_iter()
            .filter(|k| !others.contains(k))
            .collect();
        let started = tokio::time::Instant::now();
        loop {
            let listed = self.slots_listing(&alone).await;
            if listed.is_empty() {
                return format!(
                    "the kinds only it fenced ({alone:?}) unlisted {:?} after the lease was gone",
                    started.elapsed()
                );
            }
            if started.elapsed() >= within {
                return format!("still listed {within:?} after the lease was gone: {listed:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The kinds slots that list the run's namespace for one of `kinds` (group, resource).
    pub(super) async fn slots_listing(&self, kinds: &[(String, String)]) -> Vec<String> {
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(self.cluster.ns.client.clone());
        let mut listing = vec![];
        for name in shipped::slot_names() {
            let Ok(policy) = policies.get(&name).await else {
                listing.push(format!("({name} not read)"));
                continue;
            };
            if let Ok(Some(a)) = shipped::assignment(&policy)
                && a.namespaces.contains(&self.cluster.ns.name)
                && kinds.contains(&(a.kind.group.clone(), a.kind.resource.clone()))
            {
                listing.push(name);
            }
        }
        listing
    }
}
