//! The cluster tests that assert no duration and no liveness bound: the CRDs and the
//! operator's permissions, the holder's Role, the Kubernetes-object fence, the PostgreSQL and
//! Redis guards, the README's examples. They wait on conditions with deadlines, so `make test`
//! runs them while the background build still builds (hack/test). Every module runs alone
//! there (`cargo test --test cluster -- operator::crds::`): a few change the whole control
//! plane for a moment (`operator::crd_reinstall`, `operator::schema_drift`,
//! `operator::namespaces`).

extern crate fenced_lease_tests as common;
mod fence;
mod holder;
mod operator;
mod readme;
