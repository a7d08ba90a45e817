//! The operator: grants, hand-overs, expiries, restarts, its Service and its writes.

mod control_plane_restart;
mod edges;
mod heartbeat_writes;
mod invariants;
mod mass_deletion;
mod queue_positions;
mod service;
mod start_over;
