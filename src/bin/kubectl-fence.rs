//! `kubectl-fence`: on PATH, it works as `kubectl fence`. See `kubectl fence --help`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    fenced_lease::holder::cli::main()
}
