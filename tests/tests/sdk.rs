//! The Rust guest SDK's own unit and doc tests: it is its own workspace (it builds for
//! wasm32-wasip2 in guests), so the host workspace's test command runs it from here.

#[test]
fn guest_sdk_unit_and_doc_tests_pass() {
    let sdk = wasq_tests::repo_root().join("sdk/rust/Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["test", "--quiet", "--manifest-path"])
        .arg(&sdk)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("run cargo test for the SDK");
    assert!(
        out.status.success(),
        "SDK tests failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
