//! What the fence's admission objects cost the cluster, at 0, 1,000 and 10,000 fenced leases
//! (issue 39), side by side in one run on one control plane, with the operator (the real
//! binary, serving every namespace) running and every lease Held, so that its fences are in
//! force. At each size N, in the order given (the first, 0, is the baseline; it is measured
//! again at the end, for drift):
//!
//! 1. N leases spread over 100 namespaces: 50 namespaces of leases with `spec.fenceObjects:
//!    true`, 50 of leases with `spec.fence: {resources: [{resource: configmaps}]}`, each with
//!    one claim (no pod; made by the admin, as `bench-scale` does) — how long until all are
//!    Held, and how many admission objects (ValidatingAdmissionPolicies and bindings) the
//!    cluster then holds;
//! 2. the kube-apiserver's resident memory (VmRSS, from its pid file under `$FL_CP_DIR`) right
//!    then, and again after a deliberate settle of `--settle` seconds (Go's heap and the
//!    apiserver's informers come to rest; the only sleep of this program that is not a wait
//!    on a condition);
//! 3. write latencies, as cluster-admin over one keep-alive connection of their own, in
//!    interleaved rounds so that any drift of the machine hits every kind alike: a ConfigMap
//!    create, update and delete in a namespace no lease touches (unfenced); an update of a
//!    ConfigMap labelled `fencing.dev/lease=<lease>` and stamped with that lease's current
//!    token, in a namespace of fenceObjects leases; a ConfigMap create, update and delete in a
//!    namespace of leases that fence configmaps by kind. Every one must be accepted. At N = 0
//!    the same objects are written in the same namespaces, where no lease exists;
//! 4. the grant latency of `--grant-samples` fresh leases created at that size (half of each
//!    kind, in the same namespaces, one at a time: the lease, then at once its claim; claim
//!    created -> lease Held, as a watch on the leases sees it), and the identity window of
//!    I11: hand-overs of a lease that fences configmaps by kind between two pods (Pending pods,
//!    clients with tokens bound to them, as a pod mounts), the holder releasing its claim and
//!    the operator granting the other pod's waiting claim; the old holder's pod probes with
//!    dry-run ConfigMap creates until the apiserver refuses it. The window is measured from the
//!    grant (the lease's `status.acquireTime`, which the operator sets before it sends the
//!    write) and from the release. The fencing is the operator's: this program creates no
//!    admission object;
//! 5. every lease and claim deleted (claims first, `--concurrency` at a time): how long until
//!    all leases are gone, and until the admission objects are back to the baseline count;
//!    the apiserver's memory after that and a settle.
//!
//! Rows go to `--results` (section "admission at scale"), every sample to
//! `<log-dir>/admission-<run>-samples.tsv`, the operator's log to `<log-dir>`; a table of the
//! medians is printed at the end. Fails (exit 1) when a fenced write is refused, a lease is not
//! Held in time (`--stall`, `--grant-timeout`), or the operator exits; it then prints the
//! operator's state and deletes what it created. One module per step in `src/admission/`.
//!
//! ```console
//! $ export FL_CP_DIR=/tmp/fl-cp-bench; eval "$(hack/control-plane up)"
//! $ KUBECTL=$(hack/control-plane bin-dir)/kubectl hack/crds install   # CRDs and deploy/admission/
//! $ cargo build --release --bin fenced-lease-operator && cargo build --release --bin bench-admission
//! $ target/release/bench-admission --sizes 0,1000 --operator target/release/fenced-lease-operator
//! ```
//! (`BENCH_ONLY=admission BENCH_ADMISSION_SIZES=0,1000 make bench`, or `make bench-admission`,
//! does all of this.)

use clap::Parser;
use fenced_lease_bench::admission::{Args, run};

#[tokio::main]
async fn main() {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("bench_admission: {e}");
            std::process::exit(1);
        }
    }
}
