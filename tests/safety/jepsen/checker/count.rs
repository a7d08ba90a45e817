//! The history counted: operations, grants, writes per resource, faults, the apiserver's
//! `failed to configure policy` refusals around control-plane restarts.

use std::collections::HashMap;

use super::Report;
use super::unfenced::unconfigured;
use crate::history::{Entry, Event, FaultKind, Resource};

pub(super) fn count(entries: &[&Entry], r: &mut Report) {
    let mut resource_of: HashMap<&str, Resource> = HashMap::new();
    // The end of the last control-plane restart, or None while one is under way.
    let mut restarted: Option<u64> = None;
    let mut restarting = false;
    for e in entries {
        match &e.ev {
            Event::FaultStart {
                kind: FaultKind::RestartApiserver | FaultKind::RestartEtcd,
                ..
            } => restarting = true,
            Event::FaultEnd {
                kind: FaultKind::RestartApiserver | FaultKind::RestartEtcd,
                ..
            } => {
                restarting = false;
                restarted = Some(e.t);
                r.restart_windows.push(0);
            }
            Event::WriteFailed { error, .. } if unconfigured(error) => {
                r.policy_unconfigured += 1;
                if restarting {
                    r.policy_unconfigured_during_restart += 1;
                } else if let (Some(at), Some(window)) = (restarted, r.restart_windows.last_mut()) {
                    let after = e.t.saturating_sub(at);
                    *window = (*window).max(after);
                    r.policy_unconfigured_after_restart = Some(
                        r.policy_unconfigured_after_restart
                            .map_or(after, |a| a.max(after)),
                    );
                }
            }
            _ => {}
        }
        match &e.ev {
            Event::Waiting { .. } => r.acquire_attempts += 1,
            Event::Spawned { process, .. } if process.starts_with("cli-") => {
                r.acquire_attempts += 1
            }
            Event::Acquired { .. } if e.p.starts_with("go-") => r.acquired_go += 1,
            Event::Acquired { .. } if e.p.starts_with("golock-") => r.acquired_go_lock += 1,
            Event::Acquired { .. } if e.p.starts_with("follow-") => r.acquired_follow += 1,
            Event::Acquired { .. } => r.acquired_library += 1,
            Event::CmdStarted { .. } => r.acquired_cli += 1,
            Event::Released { .. } => r.releases += 1,
            Event::Lost { .. } | Event::CmdStopped { .. } => r.losses += 1,
            Event::TokenOk { .. } => r.token_ok += 1,
            Event::TokenErr { .. } => r.token_err += 1,
            Event::WriteAttempt { id, resource, .. } => {
                resource_of.insert(id, *resource);
                r.writes.entry(*resource).or_default().attempted += 1;
            }
            Event::WriteAccepted { id, .. } => {
                if let Some(res) = resource_of.get(id.as_str()) {
                    r.writes.entry(*res).or_default().accepted += 1;
                }
            }
            Event::WriteRefused { id, .. } => {
                if let Some(res) = resource_of.get(id.as_str()) {
                    r.writes.entry(*res).or_default().refused += 1;
                }
            }
            Event::WriteFailed { id, .. } => {
                if let Some(res) = resource_of.get(id.as_str()) {
                    r.writes.entry(*res).or_default().failed += 1;
                }
            }
            Event::FaultStart { kind, .. } => *r.faults.entry(*kind).or_default() += 1,
            _ => {}
        }
    }
}
