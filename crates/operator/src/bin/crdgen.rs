//! Writes the CRD YAML under `crds/` from the Rust types, and the kinds slots of the object
//! fence under `deploy/admission/`, or checks that they are up to date.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use fenced_lease_operator::admission::shipped;

/// Generate crds/*.yaml from the Rust types in crates/api/, and deploy/admission/fence-kinds.yaml.
#[derive(Parser)]
#[command(
    version,
    after_help = "Example:\n  cargo run --bin fenced-lease-crdgen -- --dir crds"
)]
struct Args {
    /// Directory to write the YAML files into.
    #[arg(long, default_value = "crds")]
    dir: PathBuf,
    /// Directory of the admission policies, where the kinds slots are written.
    #[arg(long, default_value = "deploy/admission")]
    admission_dir: PathBuf,
    /// Do not write; exit 1 if any file differs from what the types generate.
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let files = match fenced_lease_api::crd_files() {
        Ok(files) => files,
        Err(err) => {
            eprintln!("error: cannot render CRDs: {err}");
            return ExitCode::FAILURE;
        }
    };
    let slots = match shipped::slots_yaml() {
        Ok(yaml) => yaml,
        Err(err) => {
            eprintln!("error: cannot render the kinds slots: {err}");
            return ExitCode::FAILURE;
        }
    };
    let files = files
        .into_iter()
        .map(|f| (args.dir.join(f.file_name), f.yaml))
        .chain([(args.admission_dir.join(shipped::SLOTS_FILE), slots)]);
    let mut stale = false;
    for (path, yaml) in files {
        if args.check {
            let current = std::fs::read_to_string(&path).unwrap_or_default();
            if current != yaml {
                eprintln!(
                    "{} is out of date: run `cargo run --bin fenced-lease-crdgen`",
                    path.display()
                );
                stale = true;
            }
        } else {
            let dir = path.parent().unwrap_or(&args.dir);
            if let Err(err) =
                std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, &yaml))
            {
                eprintln!("error: cannot write {}: {err}", path.display());
                return ExitCode::FAILURE;
            }
            println!("wrote {}", path.display());
        }
    }
    if stale {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
