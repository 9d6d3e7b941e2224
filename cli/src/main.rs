//! The `wasq` binary: everything lives in the `wasq_cli` library.

fn main() -> std::process::ExitCode {
    wasq_cli::main()
}
