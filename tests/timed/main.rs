//! The cluster tests that measure time: the operator's grants, expiries and restarts, the
//! holders' deadlines and outages, `kubectl fence`, the I11 window, and the operator's faults.
//! `make test` runs them after every build has finished (hack/test's barrier), one module at a
//! time (`cargo test --test timed -- holder::outage::`): a few restart the control plane
//! (`operator::control_plane_restart`, `holder::control_plane_restart`).

extern crate fenced_lease_tests as common;
mod fence;
mod holder;
mod operator;
mod safety;
