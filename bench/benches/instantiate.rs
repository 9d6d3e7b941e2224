//! Pooled instantiate + call of the `hello` example: a fresh wasmtime Store and instance
//! from the cached InstancePre per run, the whole `run` export (two steps, logs,
//! progress) included. The per-run cost wasq adds on top of the job's own work.

use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{NoJournal, hello_spec};
use wasq_core::Limits;
use wasq_sandbox::{AttemptSpec, Journal, Sandbox, SandboxConfig};

fn spec(digest: &str, journal: Arc<dyn Journal>) -> AttemptSpec {
    hello_spec(digest, journal, Limits::default())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

async fn sequential(sandbox: &Sandbox, digest: &str, journal: &Arc<dyn Journal>, label: &str) {
    for _ in 0..500 {
        let r = sandbox.run(spec(digest, journal.clone())).await;
        assert!(r.outcome.output().is_some(), "hello must succeed");
    }
    let n = 5_000;
    let mut times = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let r = sandbox.run(spec(digest, journal.clone())).await;
        times.push(t.elapsed());
        assert!(r.outcome.output().is_some());
    }
    let total = start.elapsed();
    times.sort();
    println!(
        "hello, pooled instantiate+call, sequential, {label}: mean {:.1} µs, p50 {:.1} µs, p99 {:.1} µs ({n} runs)",
        total.as_secs_f64() * 1e6 / n as f64,
        percentile(&times, 0.5),
        percentile(&times, 0.99)
    );
}

fn main() {
    let bytes = std::fs::read(wasq_tests::example_path("hello")).expect("hello.wasm");
    let sandbox = Sandbox::new(SandboxConfig {
        cache_dir: None,
        ..SandboxConfig::default()
    })
    .unwrap();
    let journal: Arc<dyn Journal> = Arc::new(NoJournal);

    // One thread: the cost of the sandbox itself, without cross-thread wake-ups.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let digest = rt
        .block_on(sandbox.validate(&bytes))
        .expect("hello validates");
    rt.block_on(sequential(
        &sandbox,
        &digest,
        &journal,
        "current-thread runtime",
    ));

    // The daemon's runtime: each attempt is its own task, possibly on another thread.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        sequential(&sandbox, &digest, &journal, "multi-thread runtime").await;
        let tasks = 4;
        let per_task = 2_500;
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (sandbox, digest, journal) = (sandbox.clone(), digest.clone(), journal.clone());
                tokio::spawn(async move {
                    for _ in 0..per_task {
                        let r = sandbox.run(spec(&digest, journal.clone())).await;
                        assert!(r.outcome.output().is_some());
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
        let total = start.elapsed();
        println!(
            "hello, pooled instantiate+call, {tasks} concurrent tasks on {} cores: {:.0} runs/s",
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            (tasks * per_task) as f64 / total.as_secs_f64()
        );
    });
}
