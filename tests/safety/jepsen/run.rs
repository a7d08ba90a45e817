//! The two profiles: `short` (every fault once, in a random order, short faults; about two
//! minutes, run by `make test`) and `long` (`make soak`: every fault once, then faults at
//! random until `--duration` has passed). Both print the seed: `--seed` replays the same
//! faults in the same order with the same targets chosen among what is there (timing, and so
//! the exact history, differ from run to run).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::checker::{self, Config};
use crate::cluster::{Cluster, LEASES};
use crate::history::{self, FaultKind, Recorder};
use crate::nemesis::{Nemesis, Pace};

pub const USAGE: &str = "usage: jepsen [--profile short|long] [--seed N] [--duration 20m] [--keep]
       jepsen --check DIR      (check a kept history again)

  --profile   short: every fault once, short faults (the default; make test)
              long: every fault once, then faults at random until --duration (make soak)
  --seed      the random seed (default: random; printed, to replay a run's faults)
  --duration  how long the long profile injects faults (default 20m)
  --keep      keep the history directory even when the run passes";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    Short,
    Long,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub profile: Profile,
    pub seed: u64,
    pub duration: Duration,
    pub keep: bool,
    pub check: Option<PathBuf>,
}

impl Options {
    /// Our flags, among whatever `cargo test` passes (libtest flags are ignored; a name filter
    /// that does not match this suite skips it, as libtest would). `Ok(None)`: nothing to run.
    pub fn parse(args: impl Iterator<Item = String>) -> Result<Option<Options>, String> {
        let mut options = Options {
            profile: Profile::Short,
            seed: rand::random::<u32>().into(),
            duration: Duration::from_secs(20 * 60),
            keep: false,
            check: None,
        };
        let mut args = args.peekable();
        let mut filters = vec![];
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let mut value = |name: &str| {
                inline
                    .clone()
                    .or_else(|| args.next())
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match flag.as_str() {
                "--profile" => {
                    options.profile = match value("--profile")?.as_str() {
                        "short" => Profile::Short,
                        "long" => Profile::Long,
                        other => return Err(format!("unknown profile {other:?}")),
                    }
                }
                "--seed" => {
                    options.seed = value("--seed")?
                        .parse()
                        .map_err(|e| format!("--seed: {e}"))?
                }
                "--duration" => {
                    options.duration = humantime::parse_duration(&value("--duration")?)
                        .map_err(|e| format!("--duration: {e} (e.g. 20m, 1h)"))?
                }
                "--keep" => options.keep = true,
                "--check" => options.check = Some(value("--check")?.into()),
                "--help" | "-h" => {
                    println!("{USAGE}");
                    return Ok(None);
                }
                "--list" => {
                    println!("short_profile: test");
                    return Ok(None);
                }
                "--ignored" => return Ok(None),
                "--test-threads" | "--skip" | "--format" | "--color" | "--logfile" | "-Z"
                    if inline.is_none() =>
                {
                    args.next();
                }
                f if f.starts_with('-') => {}
                _ => filters.push(arg),
            }
        }
        if !filters.is_empty()
            && !filters
                .iter()
                .any(|f| "jepsen::short_profile".contains(f.as_str()))
        {
            println!("jepsen: filtered out");
            return Ok(None);
        }
        Ok(Some(options))
    }
}

/// The command that replays a run of `options`.
fn replay_command(options: &Options) -> String {
    match options.profile {
        Profile::Short => format!(
            "cargo test --all-features --test jepsen -- --seed {}",
            options.seed
        ),
        Profile::Long => format!(
            "make soak SEED={} DURATION={}",
            options.seed,
            humantime::format_duration(options.duration)
        ),
    }
}

/// Warm-up: every lease granted once, with no fault yet, within 90 s.
async fn warm_up(cluster: &Cluster, run_dir: &std::path::Path) {
    let mut grants = cluster.grants.subscribe();
    let mut granted = std::collections::BTreeSet::new();
    let warm = tokio::time::timeout(Duration::from_secs(90), async {
        while granted.len() < LEASES.len() {
            if let Ok(grant) = grants.recv().await {
                granted.insert(grant.target.lease);
            }
        }
    })
    .await;
    assert!(
        warm.is_ok(),
        "the leases were not all granted within 90 s of the start (granted: {granted:?}); logs in {}",
        run_dir.display()
    );
}

/// The faults: each kind once, in an order drawn from the seed, then (the long profile) kinds
/// drawn at random until its duration is up; a pause to settle after each.
async fn inflict_faults(
    cluster: &Cluster,
    options: &Options,
    run_dir: &std::path::Path,
    started: Instant,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(options.seed);
    let mut schedule: Vec<FaultKind> = FaultKind::ALL.to_vec();
    schedule.shuffle(&mut rng);
    let (pace, settle) = match options.profile {
        Profile::Short => (Pace { spread: 0.3 }, (1.0, 0.5)),
        Profile::Long => (Pace { spread: 1.0 }, (1.0, 3.0)),
    };
    let mut nemesis = Nemesis {
        cluster,
        rec: Recorder::create(&run_dir.join("nemesis.jsonl"), "nemesis"),
        rng: rand::rngs::StdRng::seed_from_u64(rng.random()),
        pace,
        started,
    };
    let faults_started = Instant::now();
    let mut i = 0;
    loop {
        let kind = match schedule.get(i) {
            Some(kind) => *kind,
            None if options.profile == Profile::Long
                && faults_started.elapsed() < options.duration =>
            {
                FaultKind::ALL[rng.random_range(0..FaultKind::ALL.len())]
            }
            None => break,
        };
        i += 1;
        nemesis.run(kind).await;
        let (min, extra) = settle;
        tokio::time::sleep(Duration::from_secs_f64(min + rng.random_range(0.0..=extra))).await;
    }
}

/// Runs a profile (or re-checks a kept history); whether it passed.
pub async fn main(options: Options) -> bool {
    if let Some(dir) = &options.check {
        return check(dir, &options);
    }
    let started = Instant::now();
    let run_dir = std::env::temp_dir().join(format!(
        "fenced-lease-jepsen-{}-{}",
        options.seed,
        std::process::id()
    ));
    std::fs::create_dir_all(&run_dir).expect("run directory");
    eprintln!(
        "jepsen: profile {:?}, seed {} (replay: {}); history in {}",
        options.profile,
        options.seed,
        replay_command(&options),
        run_dir.display()
    );

    let mut cluster = Cluster::start(&run_dir, options.seed).await;
    warm_up(&cluster, &run_dir).await;
    eprintln!(
        "jepsen: {:>8.1}s  workload running; faults begin",
        started.elapsed().as_secs_f64()
    );
    inflict_faults(&cluster, &options, &run_dir, started).await;
    eprintln!(
        "jepsen: {:>8.1}s  faults over; stopping the holders",
        started.elapsed().as_secs_f64()
    );
    cluster.stop().await;
    let passed = check(&run_dir, &options);
    cluster.cleanup().await;
    drop(cluster);
    let _ = std::fs::remove_dir_all(run_dir.join("bin"));
    eprintln!("jepsen: took {:.0?}", started.elapsed());
    if passed && !options.keep {
        let _ = std::fs::remove_dir_all(&run_dir);
    } else {
        eprintln!("jepsen: history and logs kept in {}", run_dir.display());
    }
    passed
}

/// Checks the history in `dir`, prints the table and the first violation; whether it passed.
fn check(dir: &std::path::Path, options: &Options) -> bool {
    let (entries, damaged) = match history::load(dir) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("jepsen: cannot read the history in {}: {e}", dir.display());
            return false;
        }
    };
    let config = Config::default();
    let report = checker::check(&entries, &config);
    let what = match &options.check {
        Some(dir) => format!("history {}", dir.display()),
        None => format!("seed {}", options.seed),
    };
    println!(
        "\njepsen: {what}, {} events ({damaged} lines cut short by a kill)",
        entries.len()
    );
    println!("{report}");
    if report.test_bed_step_downs().next().is_some() {
        println!(
            "jepsen: TEST-BED WARNING: an operator replica stepped down with no fault acting on it (above): the machine was too slow for it to renew its leader lease (a build beside the suite?); a liveness violation near it may be the test bed's, not the operator's"
        );
    }
    match report.first_violation() {
        None => {
            println!("jepsen: no violations");
            true
        }
        Some(v) => {
            println!(
                "jepsen: FIRST VIOLATION ({}) at {}:\n  {}",
                v.kind.name(),
                report.secs(v.at),
                v.message
            );
            false
        }
    }
}
