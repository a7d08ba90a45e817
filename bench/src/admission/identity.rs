//! Step 4b: the identity window of I11. Hand-overs of a lease that fences configmaps by kind
//! between two pods (Pending pods, clients with tokens bound to them, as a pod mounts): the
//! holder releases its claim and the operator grants the other pod's waiting claim; the old
//! holder's pod probes with dry-run ConfigMap creates until the apiserver refuses it. The
//! window is measured from the grant (the lease's `status.acquireTime`, which the operator sets
//! before it sends the write) and from the release. The fencing is the operator's: this
//! program creates no admission object.

use std::time::{Duration, Instant, SystemTime};

use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use kube::api::{Api, DeleteParams, PostParams};

use super::Bench;
use super::calls::{call, call_timeout, delete_quietly};
use super::layout::{Kind, configmap, fenced_lease};
use crate::figures::ms;
use crate::objects::claim;
use crate::writers::{WriterPod, writer_clients};
use crate::{Res, fail};

/// The lease handed over.
const LEASE: &str = "ident";

/// Claim `<pod>-<k>` of pod `pod` for the lease.
fn pod_claim(pod: &str, k: usize) -> FencedLeaseClaim {
    let mut c = claim(&format!("{pod}-{k}"), LEASE);
    c.spec.holder_identity = pod.to_string();
    c.spec.pod_name = Some(pod.to_string());
    c
}

/// What the hand-overs measured, ms each.
#[derive(Default)]
struct HandOvers {
    /// The grant (the lease's acquireTime) -> the old holder's pod refused.
    from_grant: Vec<f64>,
    /// The release -> the old holder's pod refused.
    from_release: Vec<f64>,
    /// The release -> the next holder Held.
    handover: Vec<f64>,
    /// One write by the holder's pod, before its release.
    round_trips: Vec<f64>,
    /// Hand-overs whose first probe after the release was already refused.
    first_probe: usize,
}

impl Bench {
    /// I11: hand-overs between the two writer pods of a lease fencing configmaps by kind.
    pub(super) async fn identity_window(&mut self, label: &str) -> Res<()> {
        let ns = self.layout.i11.clone();
        let probe = configmap("probe", &[], &[]);
        let writers = writer_clients(&self.client, &ns, &self.pods, probe, call_timeout()).await?;
        let leases: Api<FencedLease> = Api::namespaced(self.client.clone(), &ns);
        let claims: Api<FencedLeaseClaim> = Api::namespaced(self.client.clone(), &ns);
        call(
            "create lease ident",
            leases.create(
                &PostParams::default(),
                &fenced_lease(LEASE, Kind::Configmaps, &self.layout.run)?,
            ),
        )
        .await?;
        let mut current = format!("{}-0", writers[0].name);
        let result = async {
            self.in_force(&ns, &writers).await?;
            let mut h = HandOvers::default();
            for k in 1..=self.args.identity_samples {
                current = self.hand_over(&ns, &writers, k, &current, &mut h).await?;
            }
            Res::Ok(h)
        }
        .await;
        let _ = delete_quietly(&claims, &current).await;
        let removed = self
            .remove_leases(&[(ns.clone(), LEASE.to_string())], LEASE)
            .await;
        let h = result?;
        removed?;
        self.report_identity(label, &ns, &h);
        Ok(())
    }

    /// The first pod's claim granted, and the rule in force: the holder's pod may write, the
    /// other may not.
    async fn in_force(&mut self, ns: &str, writers: &[WriterPod]) -> Res<()> {
        let claims: Api<FencedLeaseClaim> = Api::namespaced(self.client.clone(), ns);
        call(
            "create the first claim",
            claims.create(&PostParams::default(), &pod_claim(&writers[0].name, 0)),
        )
        .await?;
        let first = format!("{}-0", writers[0].name);
        self.leases
            .wait_held(
                &mut self.operator,
                ns,
                LEASE,
                &first,
                Duration::from_secs(60),
            )
            .await?;
        let warm = Instant::now();
        loop {
            let holder_writes = !writers[0].refused().await?;
            if holder_writes && writers[1].refused().await? {
                return Ok(());
            }
            if warm.elapsed() > Duration::from_secs(30) {
                return fail("the identity rule was not in force 30 s after the grant");
            }
        }
    }

    /// Hand-over `k`: the other pod's claim queued, the holder's claim `current` released, the
    /// old pod probing until refused. Its samples go to `h`; the new holder's claim.
    async fn hand_over(
        &mut self,
        ns: &str,
        writers: &[WriterPod],
        k: usize,
        current: &str,
        h: &mut HandOvers,
    ) -> Res<String> {
        let leases: Api<FencedLease> = Api::namespaced(self.client.clone(), ns);
        let claims: Api<FencedLeaseClaim> = Api::namespaced(self.client.clone(), ns);
        let (old, new) = (&writers[(k + 1) % 2], &writers[k % 2]);
        let next = format!("{}-{k}", new.name);
        call(
            format!("create claim {next}"),
            claims.create(&PostParams::default(), &pod_claim(&new.name, k)),
        )
        .await?;
        queued(&claims, &next).await?;
        let before = Instant::now();
        if old.refused().await? {
            return fail(format!("pod {} refused before it released", old.name));
        }
        h.round_trips.push(ms(before.elapsed()));
        call(
            format!("release {current}"),
            claims.delete(current, &DeleteParams::default()),
        )
        .await?;
        let released = Instant::now();
        let (refused_wall, probes) = refused(old, released).await?;
        let refused = Instant::now();
        h.first_probe += usize::from(probes == 1);
        let held = self
            .leases
            .wait_held(
                &mut self.operator,
                ns,
                LEASE,
                &next,
                Duration::from_secs(30),
            )
            .await?;
        let granted = call("get lease ident", leases.get(LEASE))
            .await?
            .status
            .and_then(|s| s.acquire_time)
            .ok_or("lease ident Held without an acquireTime")?;
        let granted = SystemTime::from(granted.0);
        let window = match refused_wall.duration_since(granted) {
            Ok(d) => ms(d),
            Err(e) => -ms(e.duration()),
        };
        h.from_grant.push(window);
        h.from_release.push(ms(refused - released));
        h.handover
            .push(ms(held.saturating_duration_since(released)));
        Ok(next)
    }

    fn report_identity(&self, label: &str, ns: &str, h: &HandOvers) {
        let (samples, first_probe) = (h.from_grant.len(), h.first_probe);
        let note = format!(
            "{samples} hand-overs of lease {ns}/{LEASE} (spec.fence configmaps) between two pods, each way in turn: the holder's claim deleted, the other pod's waiting claim granted by the operator; probes are dry-run ConfigMap creates by the old holder's pod (pod-bound token), back to back; the first probe after the release was already refused in {first_probe} of {samples}"
        );
        self.out.samples(
            label,
            "I11 window: grant (lease acquireTime) -> old holder's pod refused",
            &h.from_grant,
            "ms",
            &format!("{note}; acquireTime is set by the operator before it sends the grant, so this includes the grant's write"),
        );
        self.out.samples(
            label,
            "hand-over: release -> old holder's pod refused",
            &h.from_release,
            "ms",
            &note,
        );
        self.out.samples(
            label,
            "hand-over: release -> next holder Held",
            &h.handover,
            "ms",
            &format!("{note}; Held as a watch on the leases sees it"),
        );
        self.out.samples(
            label,
            "write by the holder's pod (dry-run ConfigMap create)",
            &h.round_trips,
            "ms",
            "one per hand-over, before the release: how long one probe takes",
        );
    }
}

/// Waits until claim `next` is queued: the operator has seen it (a status) before the release.
async fn queued(claims: &Api<FencedLeaseClaim>, next: &str) -> Res<()> {
    let queued = Instant::now();
    loop {
        let c = call(format!("get claim {next}"), claims.get(next)).await?;
        if c.status.is_some_and(|s| s.phase.is_some()) {
            return Ok(());
        }
        if queued.elapsed() > Duration::from_secs(30) {
            return fail(format!("claim {next} had no status 30 s after its create"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Probes as `old`, back to back, until refused: the wall-clock time of the refusal, and how
/// many probes it took. Fails 30 s after `released`.
async fn refused(old: &WriterPod, released: Instant) -> Res<(SystemTime, usize)> {
    let mut probes = 0;
    loop {
        probes += 1;
        if old.refused().await? {
            return Ok((SystemTime::now(), probes));
        }
        if released.elapsed() > Duration::from_secs(30) {
            return fail(format!(
                "pod {} still allowed to write 30 s after its release",
                old.name
            ));
        }
    }
}
