fn main() -> std::process::ExitCode {
    wasq_cli::main()
}
