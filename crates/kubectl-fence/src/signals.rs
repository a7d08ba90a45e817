//! The signals `kubectl fence` listens to, registered once for the whole run so that none is
//! lost between two passes of a loop (a listener created after a signal arrived never sees
//! it).

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

/// Signals that end a process by default and that a shell or a supervisor sends: passed on
/// to CMD while it runs; while waiting for the lease, they withdraw the claim and end
/// `kubectl fence` with 128 + N.
pub const TERMINATING: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Every other signal handled: job control (Ctrl-Z, `fg`/`bg`), the terminal's size.
const OTHERS: [Signal; 3] = [Signal::SIGTSTP, Signal::SIGCONT, Signal::SIGWINCH];

/// Listeners for [`TERMINATING`] and the job-control signals.
pub struct Signals {
    listeners: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    /// Starts listening. A signal that cannot be listened to is reported and keeps its
    /// default action.
    pub fn new() -> Self {
        let listeners = TERMINATING
            .into_iter()
            .chain(OTHERS)
            .filter_map(|sig| match signal(SignalKind::from_raw(sig as i32)) {
                Ok(listener) => Some((sig, listener)),
                Err(error) => {
                    tracing::warn!(signal = %sig, %error, "cannot listen to signal");
                    None
                }
            })
            .collect();
        Signals { listeners }
    }

    /// The next signal received.
    pub async fn recv(&mut self) -> Signal {
        if self.listeners.is_empty() {
            return std::future::pending().await;
        }
        let waits = self.listeners.iter_mut().map(|(sig, listener)| {
            let sig = *sig;
            Box::pin(async move {
                listener.recv().await;
                sig
            })
        });
        futures::future::select_all(waits).await.0
    }
}

/// Whether `signal` ends a process by default (and so ends a wait).
pub fn is_terminating(signal: Signal) -> bool {
    TERMINATING.contains(&signal)
}

/// Stops this process, as the default action of SIGTSTP would (its handler replaced it).
pub fn stop_self() {
    let _ = nix::sys::signal::raise(Signal::SIGSTOP);
}
