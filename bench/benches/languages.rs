//! What a task's language costs at deploy and at start: the hello task `wasq init` writes
//! for each language, built with that language's toolchain, then
//! - component size;
//! - deploy: validate + compile (what `PUT /v1/functions/NAME` waits for), into a fresh
//!   compiled-artifact cache;
//! - first run on a worker that did not compile it (another process, or after a restart):
//!   the artifact is loaded from the disk cache, linked, instantiated and run;
//! - later runs: instantiate + run from the loaded component (median and p99 of 200).
//!
//! Run with `cargo bench -p wasq-bench --bench languages`. A language whose toolchain is
//! missing is skipped with a line saying so (`tests/setup.sh` installs them all).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{NoJournal, hello_spec};
use wasq_cli::project::{Lang, build_at, init_in};
use wasq_core::Limits;
use wasq_sandbox::{AttemptSpec, Sandbox, SandboxConfig};

fn spec(digest: &str) -> AttemptSpec {
    // Interpreters (JS, Python) start with a bigger heap than Rust or C need.
    let limits = Limits {
        timeout_ms: 60_000,
        fuel: 100_000_000_000,
        memory_bytes: 512 << 20,
    };
    hello_spec(digest, Arc::new(NoJournal), limits)
}

fn sandbox(cache: &Path) -> Sandbox {
    Sandbox::new(SandboxConfig {
        cache_dir: Some(cache.to_owned()),
        ..SandboxConfig::default()
    })
    .expect("sandbox")
}

async fn run_once(sandbox: &Sandbox, digest: &str) -> Duration {
    let t = Instant::now();
    let r = sandbox.run(spec(digest)).await;
    let elapsed = t.elapsed();
    let out = r.outcome.output().map(String::from_utf8_lossy);
    assert!(
        out.as_deref().is_some_and(|o| o.contains("Hello, Ada!")),
        "hello must greet Ada: {:?}",
        r.outcome.error()
    );
    elapsed
}

fn ms(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{} µs", d.as_micros())
    } else {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    }
}

async fn measure(lang: Lang) {
    let dir = tempfile::tempdir().unwrap();
    let built =
        init_in(dir.path(), lang, "hello").and_then(|_| build_at(&dir.path().join("hello")));
    let bytes = match built {
        Ok(built) => built.component,
        Err(e) => {
            println!("| {lang:?} | skipped: {e:#} |");
            return;
        }
    };
    let cache = tempfile::tempdir().unwrap();

    let deployer = sandbox(cache.path());
    let t = Instant::now();
    let digest = deployer
        .validate(&bytes)
        .await
        .expect("the component validates");
    let deploy = t.elapsed();
    drop(deployer);

    let worker = sandbox(cache.path());
    let t = Instant::now();
    worker
        .load(&digest, &bytes)
        .await
        .expect("load from the cache");
    run_once(&worker, &digest).await;
    let first = t.elapsed();

    let mut later: Vec<Duration> = Vec::new();
    for _ in 0..200 {
        later.push(run_once(&worker, &digest).await);
    }
    later.sort();
    println!(
        "| {lang:?} | {:.1} MiB | {} | {} | {} | {} |",
        bytes.len() as f64 / (1 << 20) as f64,
        ms(deploy),
        ms(first),
        ms(later[later.len() / 2]),
        ms(later[later.len() * 99 / 100]),
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "| language | component | deploy (validate + compile) | first run on a new worker (cache load + run) | later runs p50 | p99 |"
    );
    println!("|---|---|---|---|---|---|");
    for lang in [Lang::Rust, Lang::Js, Lang::Python, Lang::C] {
        rt.block_on(measure(lang));
    }
}
