//! Measures the resource side and prints medians, p99 and worst cases:
//!
//! - the lease rule's window: a lease's new token written (its status write answered) -> a
//!   write carrying the previous token refused by the apiserver. The lease rule reads the
//!   lease from the apiserver's informer cache, so for this long a stale holder's write to an
//!   object the new holder has not written yet still passes. (The per-object rule has no
//!   window: it compares with the stored object.) The token is raised by a status write as
//!   the admin, exactly the write a grant is, so the figure is the apiserver's own lag, not
//!   the operator's; probes are dry-run creates, which admission checks like real ones.
//! - the identity rule's window: a grant that moves the lease from pod A to pod B written (its
//!   status write answered) -> a write by pod A (a client with a token bound to pod A, as the
//!   pod mounts) refused by the apiserver. For this long after a grant the old holder's pod
//!   can still write what the lease fences. The grant is written as the admin, as above, and
//!   goes from A to B and back, so every sample is a hand-over; probes are dry-run creates of
//!   a ConfigMap, a kind the lease fences. The pods stay Pending (no kubelet needed);
//! - the cost of a guarded PostgreSQL write against the same write unguarded (one UPDATE by
//!   primary key), and of a guarded transaction against an unguarded one;
//! - the cost of a guarded Redis SET against a plain SET.
//!
//! ```console
//! $ eval "$(hack/control-plane up)" && eval "$(hack/datastores up)"
//! $ kubectl apply -f crds/ -f deploy/admission/
//! $ cargo run --release --bin bench-fence
//! ```
//!
//! Every sample of the two windows is written to `--log-dir` (one TSV file per run). One
//! module per measurement in `src/fence/`.

use clap::Parser;
use fenced_lease_bench::Res;
use fenced_lease_bench::fence::{Args, run};

#[tokio::main]
async fn main() -> Res<()> {
    run(Args::parse()).await
}
