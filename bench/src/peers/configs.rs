//! The configurations measured: each system with its default timings and with the fastest it
//! allows, and the floor of an acquire.

use std::time::Duration;

#[derive(Clone, Debug)]
pub(super) enum System {
    /// fenced-lease library, lease duration in seconds.
    Library(u32),
    /// kubectl fence run, lease duration in seconds.
    Cli(u32),
    /// The Go library on a FencedLease of this many seconds: its own elector (package
    /// election), or client-go's elector on its resourcelock (package lock, `-lock`).
    Go(u32, GoApi),
    /// kube-lease-manager: duration and grace, seconds.
    Klm(u64, u64),
    /// client-go: lease duration, renew deadline, retry period.
    ClientGo(Duration, Duration, Duration),
    /// The floor (acquire only): a claim's create and its grant, by one process, on a
    /// FencedLease of this many seconds.
    Floor(u32),
}

/// Which of the Go library's election paths a Go candidate takes.
#[derive(Clone, Copy, Debug)]
pub(super) enum GoApi {
    Election,
    Lock,
}

pub(super) struct Config {
    pub(super) name: String,
    pub(super) system: System,
    /// The lease duration (failover is reported minus it).
    pub(super) duration: Duration,
    /// The holder's renew period or the waiter's poll period: the random settle before an
    /// action spans it, so the action falls anywhere in the cycle.
    pub(super) period: Duration,
}

/// Every configuration, in the order measured: fenced-lease's, then its peers'.
pub(super) fn configs() -> Vec<Config> {
    let mut all = fenced_lease();
    all.extend(peers());
    all
}

fn config(name: &str, system: System, duration: Duration, period: Duration) -> Config {
    Config {
        name: name.into(),
        system,
        duration,
        period,
    }
}

/// The library, the CLI and the Go library, each with its default and fastest lease; and the
/// floor of an acquire.
fn fenced_lease() -> Vec<Config> {
    let (s, ms) = (Duration::from_secs, Duration::from_millis);
    let (election, lock) = (GoApi::Election, GoApi::Lock);
    vec![
        config(
            "fenced-lease library, 15 s lease (default)",
            System::Library(15),
            s(15),
            s(5),
        ),
        config(
            "fenced-lease library, 1 s lease (fastest)",
            System::Library(1),
            s(1),
            ms(333),
        ),
        config(
            "kubectl fence run, 15 s lease (default)",
            System::Cli(15),
            s(15),
            s(5),
        ),
        config(
            "kubectl fence run, 1 s lease (fastest)",
            System::Cli(1),
            s(1),
            ms(333),
        ),
        config(
            "fenced-lease Go election, 15 s lease (default)",
            System::Go(15, election),
            s(15),
            s(5),
        ),
        config(
            "fenced-lease Go election, 1 s lease (fastest)",
            System::Go(1, election),
            s(1),
            ms(333),
        ),
        config(
            "fenced-lease Go lock (client-go's elector), 15 s lease (default)",
            System::Go(15, lock),
            s(15),
            s(5),
        ),
        config(
            "fenced-lease Go lock (client-go's elector), 1 s lease (fastest)",
            System::Go(1, lock),
            s(1),
            ms(333),
        ),
        config(
            "floor: create a claim, write its grant (no operator)",
            System::Floor(15),
            s(15),
            s(5),
        ),
    ]
}

/// kube-lease-manager and client-go, each with its default and fastest timings.
fn peers() -> Vec<Config> {
    let (s, ms) = (Duration::from_secs, Duration::from_millis);
    vec![
        config(
            "kube-lease-manager 30/5 s (default)",
            System::Klm(30, 5),
            s(30),
            s(25),
        ),
        config(
            "kube-lease-manager 2/1 s (fastest)",
            System::Klm(2, 1),
            s(2),
            s(1),
        ),
        config(
            "client-go 15/10/2 s (default)",
            System::ClientGo(s(15), s(10), s(2)),
            s(15),
            s(2),
        ),
        config(
            "client-go 1 s/500/100 ms (fastest)",
            System::ClientGo(s(1), ms(500), ms(100)),
            s(1),
            ms(100),
        ),
    ]
}
