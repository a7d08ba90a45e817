//! Writes the CRD YAML under `crds/` from the Rust types, or checks that it is up to date.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Generate crds/*.yaml from the Rust types in src/api/.
#[derive(Parser)]
#[command(
    version,
    after_help = "Example:\n  cargo run --bin fenced-lease-crdgen -- --dir crds"
)]
struct Args {
    /// Directory to write the YAML files into.
    #[arg(long, default_value = "crds")]
    dir: PathBuf,
    /// Do not write; exit 1 if any file differs from what the types generate.
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let files = match fenced_lease::api::crd_files() {
        Ok(files) => files,
        Err(err) => {
            eprintln!("error: cannot render CRDs: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut stale = false;
    for file in files {
        let path = args.dir.join(file.file_name);
        if args.check {
            let current = std::fs::read_to_string(&path).unwrap_or_default();
            if current != file.yaml {
                eprintln!(
                    "{} is out of date: run `cargo run --bin fenced-lease-crdgen`",
                    path.display()
                );
                stale = true;
            }
        } else {
            if let Err(err) =
                std::fs::create_dir_all(&args.dir).and_then(|()| std::fs::write(&path, &file.yaml))
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
