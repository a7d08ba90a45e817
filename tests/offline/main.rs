//! The tests that need no cluster, no datastore and no clock: the generated CRDs, the grant
//! logic's model, the krew manifest, the runs the tree names, the safety suite's checker on
//! synthetic histories, and the example controller's signal handling (a deadline, no measured
//! time). `make test` runs them before the control plane is up.

extern crate fenced_lease_tests as common;

mod crd_yaml;
mod decide_model;
mod jepsen_checker;
mod krew_manifest;
mod plain_controller_signals;
mod run_links;

// The safety suite's checker, history and rules, at this crate's root as in the suite
// (tests/safety/jepsen), since they name each other by `crate::`.
#[path = "../safety/jepsen/checker/mod.rs"]
mod checker;
#[allow(dead_code)] // the rest serves the suite's processes
#[path = "../safety/jepsen/history.rs"]
mod history;
#[path = "../safety/jepsen/stale.rs"]
mod stale;
#[path = "../safety/jepsen/step_downs.rs"]
mod step_downs;
