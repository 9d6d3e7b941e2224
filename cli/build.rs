//! `wasq init` and `wasq wit` embed the SDKs, templates and WIT (src/project.rs); cargo does
//! not see files read by a macro, so name them here to rebuild when they change.
fn main() {
    for lang in ["rust", "js", "python", "c"] {
        println!("cargo:rerun-if-changed=../sdk/{lang}/src");
        println!("cargo:rerun-if-changed=../sdk/{lang}/template");
    }
    println!("cargo:rerun-if-changed=../sdk/rust/Cargo.toml");
    println!("cargo:rerun-if-changed=../wit");
}
