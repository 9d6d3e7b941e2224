//! The real CLI under another name (see `e2e_binary`), with the shipped binary's allocator,
//! so that the end-to-end tests run what users run, compile children included.

#[global_allocator]
static ALLOCATOR: wasq_cli::Allocator = wasq_cli::Allocator;

fn main() -> std::process::ExitCode {
    wasq_cli::main()
}
