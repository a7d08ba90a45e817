//! The holder side: the Rust library, leader election, `kubectl fence`.

mod control_plane_restart;
mod election;
mod hygiene;
mod kubectl_fence;
mod kubectl_fence_run;
mod library;
mod outage;
mod queue;
