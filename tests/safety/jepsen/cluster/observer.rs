//! The observer: every state of the leases and of the fenced objects a watch delivers,
//! recorded.

use super::*;

impl Cluster {
    /// Records every state of the leases and of the fenced objects the watches deliver.
    pub(super) fn observe(&mut self) {
        let rec = Arc::new(Recorder::create(
            &self.run_dir.join("observer.jsonl"),
            "observer",
        ));
        let leases: Api<FencedLease> = self.ns.api();
        let grants = self.grants.clone();
        let rec_l = rec.clone();
        self.observer.push(tokio::spawn(async move {
            let stream = watcher(leases, watcher::Config::default()).default_backoff();
            let mut stream = std::pin::pin!(stream);
            let mut last: BTreeMap<String, (Option<String>, i64)> = BTreeMap::new();
            while let Some(event) = stream.next().await {
                let Ok(event) = event else { continue };
                match event {
                    watcher::Event::Apply(lease) | watcher::Event::InitApply(lease) => {
                        let name = lease.metadata.name.clone().unwrap_or_default();
                        let status = lease.status.clone().unwrap_or_default();
                        let holder = status.holder.as_ref().map(|h| h.claim.clone());
                        rec_l.record(lease_state(&lease));
                        let now = (holder.clone(), status.fencing_token);
                        if let Some(h) = &status.holder
                            && last.get(&name) != Some(&now)
                        {
                            // A followed Lease's candidates wait in client-go, not as
                            // claims: the other leader-to-be is always there.
                            let waiting = if lease.spec.follow.is_some() {
                                1
                            } else {
                                status.waiting
                            };
                            let _ = grants.send(Grant {
                                target: Target {
                                    process: h.identity.clone(),
                                    lease: name.clone(),
                                    claim: holder_claim(h),
                                    token: status.fencing_token,
                                    term: status
                                        .lease_duration_seconds
                                        .unwrap_or(lease.spec.lease_duration_seconds),
                                },
                                waiting,
                            });
                        }
                        last.insert(name, now);
                    }
                    watcher::Event::Delete(lease) => rec_l.record(Event::LeaseGone {
                        lease: lease.metadata.name.clone().unwrap_or_default(),
                        uid: lease.metadata.uid.clone().unwrap_or_default(),
                    }),
                    _ => {}
                }
            }
        }));
        let objects: Api<ConfigMap> = self.ns.api();
        self.observer.push(tokio::spawn(async move {
            let config = watcher::Config::default().labels(LEASE_LABEL);
            let stream = watcher(objects, config).default_backoff();
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) = event else {
                    continue;
                };
                rec.record(Event::ObjectState {
                    key: cm.metadata.name.clone().unwrap_or_default(),
                    rv: cm
                        .metadata
                        .resource_version
                        .as_deref()
                        .and_then(|rv| rv.parse().ok())
                        .unwrap_or(0),
                    token: fenced_lease::fence::kube::token_of(&cm),
                    write: cm.data.as_ref().and_then(|d| d.get("write").cloned()),
                });
            }
        }));
    }
}
