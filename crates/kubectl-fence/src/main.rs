//! `kubectl fence`: the holder side from the command line. `run LEASE -- CMD` is flock(1) for
//! Kubernetes; `status`, `list`, `acquire` and `release` are for people and scripts.
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use fenced_lease::holder::{Error, report};

mod args;
mod child;
mod commands;
mod complete;
pub mod exit;
mod refusals;
pub mod report;
mod run;
mod signals;
mod token;
mod watch;

pub use args::{
    AcquireFormat, Cli, Command, Global, HolderArgs, NameFormat, ReportFormat, Shell,
    parse_duration,
};
use commands::{acquire_and_leave, list, release, status};

/// A failed command: what to print and the exit code.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure {
            code: exit::for_error(&e),
            message: report(&e),
        }
    }
}

fn failure(message: impl Into<String>) -> Failure {
    Failure {
        code: exit::ERROR,
        message: message.into(),
    }
}

/// Entry point of the `kubectl-fence` binary.
pub fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Some(code) = child::trampoline(&args) {
        return code;
    }
    if args.get(1).is_some_and(|a| a == complete::REQUEST) {
        return complete_words(&args[2..]);
    }
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            });
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // kube's client logs each failed request too; ours say it once per outage.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_client=off")),
        )
        .init();
    // Before any thread starts, so that all inherit it.
    child::block_sigttou();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kubectl fence: cannot start: {e}");
            return ExitCode::from(exit::ERROR);
        }
    };
    let code = runtime.block_on(dispatch(cli)).unwrap_or_else(|f| {
        eprintln!("kubectl fence: {}", f.message);
        f.code
    });
    ExitCode::from(code)
}

/// `kubectl-fence __complete WORDS...`: what kubectl_complete-fence and the shell scripts ask.
fn complete_words(words: &[OsString]) -> ExitCode {
    let words: Vec<String> = words
        .iter()
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::from(exit::ERROR);
    };
    print!("{}", runtime.block_on(complete::reply(&words)));
    ExitCode::from(exit::OK)
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    if let Command::Completion { shell } = cli.command {
        print!("{}", complete::script(shell));
        return Ok(exit::OK);
    }
    let (client, namespace) = connect(&cli.global).await?;
    let timeout = cli.global.request_timeout();
    match cli.command {
        Command::Status {
            lease,
            output,
            watch: false,
        } => status(client, &namespace, &lease, output, timeout).await,
        Command::Status {
            lease,
            output,
            watch: true,
        } => watch::status(client, &namespace, &lease, output, timeout).await,
        Command::List {
            all_namespaces,
            output,
        } => {
            let namespace = (!all_namespaces).then_some(namespace.as_str());
            list(client, namespace, output, timeout).await
        }
        Command::Acquire {
            lease,
            holder,
            output,
        } => acquire_and_leave(client, &namespace, &lease, &holder, output, timeout).await,
        Command::Release {
            lease,
            claims,
            all,
            identity,
            output,
        } => {
            let which = match (all, identity) {
                (true, identity) => commands::Which::All { identity },
                (false, _) => commands::Which::Claims(claims),
            };
            release(client, &namespace, &lease, which, output, timeout).await
        }
        Command::Run {
            lease,
            holder,
            grace,
            kill_group,
            scope,
            refused_exit_code,
            command,
        } => {
            let scope = scope.unwrap_or_else(|| format!("{namespace}/{lease}"));
            let how = run::How {
                grace,
                leftovers: run::Leftovers { kill: kill_group },
                scope: &scope,
                refused_exit_code,
            };
            run::run(client, &namespace, &lease, &holder, timeout, how, &command).await
        }
        Command::Token {
            lease,
            pod,
            pod_uid,
            file,
            watch,
        } => {
            let pod = token::Pod {
                name: pod,
                uid: pod_uid,
            };
            let output = token::Output { file, watch };
            token::token(client, &namespace, &lease, &pod, &output, timeout).await
        }
        Command::Completion { .. } => Ok(exit::OK), // answered above, offline
    }
}

/// A client and the namespace to use, from the flags, like kubectl.
async fn connect(global: &Global) -> Result<(Client, String), Failure> {
    let options = KubeConfigOptions {
        context: global.context.clone(),
        ..Default::default()
    };
    let mut config = match (&global.kubeconfig, &global.context) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| failure(format!("reading {}: {}", path.display(), report(&e))))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| report(&e))
        }
        (None, Some(_)) => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| report(&e)),
        (None, None) => Config::infer().await.map_err(|e| report(&e)),
    }
    .map_err(|e| failure(format!("no usable kubeconfig: {e}")))?;
    if let Some(user) = &global.impersonate {
        config.auth_info.impersonate = Some(user.clone());
        if !global.impersonate_groups.is_empty() {
            config.auth_info.impersonate_groups = Some(global.impersonate_groups.clone());
        }
    }
    let namespace = global
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = fenced_lease::client::client(config)
        .map_err(|e| failure(format!("client: {}", report(&e))))?;
    Ok((client, namespace))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn durations_parse_like_kubectl_and_sleep() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn run_takes_everything_after_the_double_dash_as_the_command() {
        let cli = Cli::try_parse_from([
            "kubectl-fence",
            "-n",
            "jobs",
            "run",
            "db",
            "--wait",
            "5m",
            "--grace",
            "2s",
            "--kill-group",
            "--",
            "sh",
            "-c",
            "echo $FENCE_TOKEN",
            "-n",
        ])
        .unwrap();
        assert_eq!(cli.global.namespace.as_deref(), Some("jobs"));
        let Command::Run {
            lease,
            holder,
            grace,
            kill_group,
            command,
            ..
        } = cli.command
        else {
            panic!("not run: {:?}", cli.command);
        };
        assert_eq!(lease, "db");
        assert_eq!(holder.wait, Some(Duration::from_secs(300)));
        assert_eq!(grace, Duration::from_secs(2));
        assert!(kill_group);
        assert_eq!(command, ["sh", "-c", "echo $FENCE_TOKEN", "-n"]);
    }

    #[test]
    fn connection_flags_work_after_the_command_too() {
        let cli = Cli::try_parse_from([
            "kubectl-fence",
            "status",
            "db",
            "-n",
            "jobs",
            "--context",
            "prod",
            "--as",
            "alice",
            "--as-group",
            "ops",
            "--request-timeout",
            "5s",
            "-o",
            "yaml",
        ])
        .unwrap();
        assert_eq!(cli.global.namespace.as_deref(), Some("jobs"));
        assert_eq!(cli.global.context.as_deref(), Some("prod"));
        assert_eq!(cli.global.impersonate.as_deref(), Some("alice"));
        assert_eq!(cli.global.impersonate_groups, ["ops"]);
        assert_eq!(cli.global.request_timeout(), Some(Duration::from_secs(5)));
        assert!(matches!(
            cli.command,
            Command::Status {
                output: Some(ReportFormat::Yaml),
                ..
            }
        ));
        // kubectl's "0": the defaults.
        let cli = Cli::try_parse_from(["kubectl-fence", "list", "--request-timeout", "0"]).unwrap();
        assert_eq!(cli.global.request_timeout(), None);
    }

    /// No flag is accepted only to be ignored: each command takes the outputs it honours,
    /// and combinations that would silently drop a flag are refused.
    #[test]
    fn flags_a_command_would_ignore_are_refused() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("kubectl-fence").chain(args.iter().copied()))
        };
        assert!(parse(&["list", "-o", "wide"]).is_ok());
        assert!(parse(&["list", "-A", "-o", "name"]).is_ok());
        assert!(parse(&["list", "-A", "-n", "jobs"]).is_err());
        assert!(parse(&["run", "db", "-o", "json", "--", "true"]).is_err());
        assert!(parse(&["acquire", "db", "-o", "wide"]).is_err());
        assert!(parse(&["acquire", "db", "-o", "name"]).is_ok());
        assert!(parse(&["status", "db", "--as-group", "ops"]).is_err());
        // release: the claims to delete, or --all; --identity only narrows --all.
        assert!(parse(&["release", "db"]).is_err());
        assert!(parse(&["release", "db", "db-x"]).is_ok());
        assert!(parse(&["release", "db", "--all"]).is_ok());
        assert!(parse(&["release", "db", "--all", "--identity", "me"]).is_ok());
        assert!(parse(&["release", "db", "db-x", "--all"]).is_err());
        assert!(parse(&["release", "db", "db-x", "--identity", "me"]).is_err());
    }

    #[test]
    fn run_needs_a_command_and_defaults_to_waiting_forever() {
        assert!(Cli::try_parse_from(["kubectl-fence", "run", "db"]).is_err());
        let cli = Cli::try_parse_from(["kubectl-fence", "run", "db", "--", "true"]).unwrap();
        let Command::Run {
            holder,
            grace,
            kill_group,
            ..
        } = cli.command
        else {
            panic!("not run");
        };
        assert_eq!(holder.wait, None);
        assert_eq!(grace, Duration::from_secs(10));
        assert!(!kill_group);
        let scoped = Cli::try_parse_from([
            "kubectl-fence",
            "run",
            "db",
            "--scope",
            "payouts",
            "--",
            "true",
        ]);
        assert!(
            matches!(scoped.unwrap().command, Command::Run { scope: Some(s), .. } if s == "payouts")
        );
        assert!(
            Cli::try_parse_from(["kubectl-fence", "run", "db", "--scope", "", "--", "true"])
                .is_err()
        );
    }

    #[test]
    fn every_command_has_help_with_an_example() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        cmd.build();
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let help = sub
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            assert!(
                help.contains("kubectl fence"),
                "{} has no example",
                sub.get_name()
            );
        }
        Cli::command().debug_assert();
    }
}
