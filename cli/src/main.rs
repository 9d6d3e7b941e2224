//! The `wasq` binary: everything lives in the `wasq_cli` library.

#[global_allocator]
static ALLOCATOR: wasq_cli::Allocator = wasq_cli::Allocator;

fn main() -> std::process::ExitCode {
    wasq_cli::main()
}
