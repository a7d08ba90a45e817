//! The operator's CRDs, permissions, namespaces and metric names.

mod crd_reinstall;
mod crds;
mod metric_names;
mod namespaces;
mod rbac;
mod schema_drift;
mod tokens_above_the_clock;
