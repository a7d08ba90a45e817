//! Shell completion, in the protocol kubectl speaks with plugins: `kubectl fence <TAB>` runs
//! `kubectl_complete-fence ARGS... WORD` (kubectl ≥ 1.26), which runs `kubectl-fence
//! __complete ARGS... WORD`; it prints one candidate per line, then `:<directive>` (cobra's
//! `__complete`: 4 = no file names, 0 = file names too). `kubectl fence completion SHELL`
//! prints the same for `kubectl-fence` typed as one word. Commands, flags and their values
//! come from the clap definition; lease and claim names from the cluster.

use std::time::Duration;

use clap::{Arg, Command as ClapCommand, CommandFactory, Parser};
use kube::api::{Api, ListParams};

use super::{Cli, Global, Shell};
use fenced_lease::api::{FencedLease, FencedLeaseClaim};

/// cobra's ShellCompDirectiveNoFileComp and ShellCompDirectiveDefault.
const NO_FILES: u8 = 4;
const FILES: u8 = 0;

/// The hidden first argument that asks for completions.
pub const REQUEST: &str = "__complete";

/// What the word being typed should be.
#[derive(Debug, PartialEq, Eq)]
enum Want {
    /// These words (commands, flags, a flag's values).
    Words(Vec<String>),
    /// A FencedLease of the namespace.
    Lease,
    /// A claim on `lease`.
    Claim { lease: String },
    /// A file name (CMD and its arguments).
    Files,
    /// Nothing we can offer (a free-form value).
    Nothing,
}

/// The commands and flags, with the global flags copied into every command.
fn definition() -> ClapCommand {
    let mut root = Cli::command();
    root.build();
    root
}

/// The flags of `command`, long and short.
fn flags(command: &ClapCommand) -> Vec<String> {
    let mut out = Vec::new();
    for arg in command.get_arguments().filter(|a| !a.is_positional()) {
        out.extend(arg.get_long().map(|long| format!("--{long}")));
        out.extend(arg.get_short().map(|short| format!("-{short}")));
    }
    out
}

/// The flag of `command` that `word` names (`--flag`, `--flag=value` or `-f`).
fn flag<'a>(command: &'a ClapCommand, word: &str) -> Option<&'a Arg> {
    let name = word.split('=').next().unwrap_or(word);
    command.get_arguments().find(|a| {
        a.get_long().is_some_and(|l| name == format!("--{l}"))
            || a.get_short().is_some_and(|s| name == format!("-{s}"))
    })
}

/// What to complete, given the words before the one being typed (`done`) and that word.
fn want(done: &[String], word: &str) -> Want {
    let root = definition();
    let mut command: Option<&ClapCommand> = None;
    let mut positionals: Vec<&str> = Vec::new();
    let mut words = done.iter();
    while let Some(w) = words.next() {
        if w == "--" {
            return Want::Files;
        }
        let scope = command.unwrap_or(&root);
        if w.starts_with('-') && w.len() > 1 {
            let takes = flag(scope, w).is_some_and(|a| a.get_action().takes_values());
            if takes && !w.contains('=') {
                words.next();
            }
        } else if command.is_none() {
            command = root.find_subcommand(w);
            if command.is_none() {
                return Want::Nothing;
            }
        } else {
            positionals.push(w);
        }
    }
    let scope = command.unwrap_or(&root);
    // A flag's value.
    if let Some(previous) = done
        .last()
        .filter(|p| p.starts_with('-') && !p.contains('='))
        && let Some(arg) = flag(scope, previous).filter(|a| a.get_action().takes_values())
    {
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .map(|v| v.get_name().to_string())
            .collect();
        return if values.is_empty() {
            Want::Nothing
        } else {
            Want::Words(values)
        };
    }
    if word.starts_with('-') {
        return Want::Words(flags(scope));
    }
    let Some(command) = command else {
        let names = root
            .get_subcommands()
            .filter(|c| !c.is_hide_set())
            .map(|c| c.get_name().to_string())
            .collect();
        return Want::Words(names);
    };
    match (command.get_name(), positionals.as_slice()) {
        ("list", _) => Want::Nothing,
        (_, []) => Want::Lease,
        ("release", [lease, ..]) => Want::Claim {
            lease: lease.to_string(),
        },
        _ => Want::Nothing,
    }
}

/// The namespace and kubeconfig flags among `done`, to list names where the command will act.
fn connection(done: &[String]) -> Global {
    let mut args = vec!["kubectl-fence".to_string()];
    let root = definition();
    let mut words = done.iter();
    while let Some(w) = words.next() {
        let Some(arg) = flag(&root, w).filter(|a| a.is_global_set()) else {
            continue;
        };
        args.push(w.clone());
        if arg.get_action().takes_values() && !w.contains('=') {
            args.extend(words.next().cloned());
        }
    }
    args.push("list".into());
    Cli::try_parse_from(args)
        .map(|cli| cli.global)
        .unwrap_or_default()
}

/// Names from the cluster: leases, or the claims on one; none when it cannot be reached
/// within two seconds (completion must not hang a shell).
async fn names(global: &Global, want: &Want) -> Vec<String> {
    const LIMIT: Duration = Duration::from_secs(2);
    let list = async {
        let (client, namespace) = super::connect(global).await.ok()?;
        match want {
            Want::Lease => {
                let leases: Api<FencedLease> = Api::namespaced(client, &namespace);
                let list = leases.list_metadata(&ListParams::default()).await.ok()?;
                Some(
                    list.items
                        .into_iter()
                        .filter_map(|l| l.metadata.name)
                        .collect(),
                )
            }
            Want::Claim { lease } => {
                let claims: Api<FencedLeaseClaim> = Api::namespaced(client, &namespace);
                let list = claims.list(&ListParams::default()).await.ok()?;
                let mine = list
                    .items
                    .into_iter()
                    .filter(|c| &c.spec.lease_name == lease);
                Some(mine.filter_map(|c| c.metadata.name).collect())
            }
            _ => None,
        }
    };
    tokio::time::timeout(LIMIT, list)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// The completion reply for `args` (the words after the program name; the last one is the
/// word being typed, possibly empty): candidates, then the directive line.
pub async fn reply(args: &[String]) -> String {
    let (word, done) = match args.split_last() {
        Some((word, done)) => (word.as_str(), done),
        None => ("", args),
    };
    let want = want(done, word);
    let (candidates, directive) = match &want {
        Want::Words(words) => (words.clone(), NO_FILES),
        Want::Lease | Want::Claim { .. } => (names(&connection(done), &want).await, NO_FILES),
        Want::Files => (vec![], FILES),
        Want::Nothing => (vec![], NO_FILES),
    };
    let mut out = String::new();
    for c in candidates.iter().filter(|c| c.starts_with(word)) {
        out.push_str(c);
        out.push('\n');
    }
    out.push_str(&format!(":{directive}\n"));
    out
}

/// `kubectl fence completion SHELL`: registers completion for `kubectl-fence` typed as one
/// word, through the same `__complete` replies.
pub fn script(shell: Shell) -> &'static str {
    match shell {
        Shell::Bash => include_str!("completion/kubectl-fence.bash"),
        Shell::Zsh => include_str!("completion/kubectl-fence.zsh"),
        Shell::Fish => include_str!("completion/kubectl-fence.fish"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want_of(line: &str) -> Want {
        let mut words: Vec<String> = line.split(' ').map(String::from).collect();
        let word = words.pop().unwrap();
        want(&words, &word)
    }

    fn words(want: Want) -> Vec<String> {
        match want {
            Want::Words(w) => w,
            other => panic!("expected words, got {other:?}"),
        }
    }

    #[test]
    fn the_first_word_is_a_command_and_hidden_ones_are_not_offered() {
        let commands = words(want_of(""));
        for c in ["status", "list", "acquire", "release", "run", "completion"] {
            assert!(commands.contains(&c.to_string()), "{commands:?}");
        }
        assert!(
            !commands.iter().any(|c| c.starts_with("__")),
            "{commands:?}"
        );
        // Global flags before the command are skipped, with their values.
        assert_eq!(want_of("-n jobs --context prod "), Want::Words(commands));
    }

    #[test]
    fn a_lease_then_a_claim_then_nothing() {
        assert_eq!(want_of("status "), Want::Lease);
        assert_eq!(want_of("run -n jobs --wait 5m "), Want::Lease);
        assert_eq!(want_of("acquire --identity=me db"), Want::Lease);
        assert_eq!(want_of("release db "), Want::Claim { lease: "db".into() });
        assert_eq!(want_of("status db "), Want::Nothing);
        assert_eq!(want_of("list "), Want::Nothing);
        assert_eq!(want_of("run db -- ./migr"), Want::Files);
        assert_eq!(want_of("bogus "), Want::Nothing);
    }

    #[test]
    fn flags_and_their_values() {
        let flags = words(want_of("run db --"));
        for f in [
            "--wait",
            "--grace",
            "--kill-group",
            "--namespace",
            "--request-timeout",
        ] {
            assert!(flags.contains(&f.to_string()), "{flags:?}");
        }
        let formats = words(want_of("status db -o "));
        assert_eq!(formats, ["wide", "name", "json", "yaml"]);
        assert_eq!(
            want_of("run --wait "),
            Want::Nothing,
            "a duration: free-form"
        );
    }

    #[test]
    fn names_are_looked_up_where_the_command_will_act() {
        let global = connection(&[
            "-n".into(),
            "jobs".into(),
            "status".into(),
            "--context=prod".into(),
        ]);
        assert_eq!(global.namespace.as_deref(), Some("jobs"));
        assert_eq!(global.context.as_deref(), Some("prod"));
    }

    #[tokio::test]
    async fn the_reply_ends_with_the_directive_and_keeps_only_matches() {
        let reply = reply(&["st".into()]).await;
        assert_eq!(reply, "status\n:4\n");
        assert_eq!(reply_of_files().await, ":0\n");
    }

    async fn reply_of_files() -> String {
        reply(&["run".into(), "db".into(), "--".into(), "".into()]).await
    }

    #[test]
    fn every_shell_has_a_script_that_calls_complete() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            assert!(script(shell).contains("__complete"), "{shell:?}");
        }
    }
}
