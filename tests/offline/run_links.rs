//! Every measured run the tree names (`bench/runs/<run>`: in code comments, documents, the
//! chart) exists, as does every file of `bench/runs/` it names: a figure quoted with its run
//! must lead the reader to that run.

use std::path::Path;

/// The runs named in `text`: what follows each `bench/runs/`, up to the first character that
/// cannot be in a run's name.
fn runs_named(text: &str) -> Vec<&str> {
    text.match_indices("bench/runs/")
        .map(|(at, m)| {
            let rest = &text[at + m.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
                .unwrap_or(rest.len());
            rest[..end].trim_end_matches('.')
        })
        .filter(|run| !run.is_empty())
        .collect()
}

/// The files of the tree at `dir`, but for build output (`target/`) and hidden folders.
fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir)
        .expect("a folder of the tree")
        .flatten()
    {
        let (path, name) = (entry.path(), entry.file_name());
        let name = name.to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                files(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

#[test]
fn every_run_the_tree_names_exists() {
    let root = common::repo_root();
    let mut all = vec![];
    files(root, &mut all);
    let mut missing = vec![];
    let mut named = 0;
    for file in all {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue; // not text
        };
        for run in runs_named(&text) {
            named += 1;
            if !root.join("bench/runs").join(run).exists() {
                let file = file
                    .strip_prefix(root)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                missing.push(format!("{file}: bench/runs/{run}"));
            }
        }
    }
    assert!(named > 0, "no run named anywhere: the scan is broken");
    assert!(
        missing.is_empty(),
        "runs named but not in bench/runs/:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_run_name_ends_where_its_characters_do() {
    // Spelled apart, so that the scan of this file finds no run.
    let text = "(R/2026-12-02-queue-and-nodelay). As R/x_y/README.md, R/README.md. Not R/<run>";
    let text = text.replace("R/", &["bench", "runs", ""].join("/"));
    assert_eq!(
        runs_named(&text),
        ["2026-12-02-queue-and-nodelay", "x_y", "README.md"]
    );
}

#[test]
fn the_index_of_runs_lists_every_run() {
    let runs = common::repo_root().join("bench/runs");
    let index = std::fs::read_to_string(runs.join("README.md")).expect("bench/runs/README.md");
    let unlisted: Vec<String> = std::fs::read_dir(&runs)
        .expect("bench/runs")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|run| !index.contains(&format!("({run}/)")))
        .collect();
    assert!(
        unlisted.is_empty(),
        "runs bench/runs/README.md does not link: {unlisted:?}"
    );
}
