//! The `wasq` binary: everything lives in the `wasq_cli` library.

/// mimalloc rather than glibc's malloc: an API server spent about 15% of its CPU in
/// malloc and free and on their arena locks (a perf profile of creates over HTTP, see
/// docs/performance.md); with mimalloc it creates about 10% more runs per second.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    wasq_cli::main()
}
