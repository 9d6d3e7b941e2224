//! bullmq-official's figure for wasq's comparative benchmark, the same workload as
//! `bench/bullmq/drain.mjs`: N jobs of a 100-byte payload are added (with `add_bulk`, or
//! one `add` each with IN_FLIGHT in flight), then one Worker at CONCURRENCY drains them;
//! completed jobs are kept (as wasq keeps results). Prints one JSON line. With `sync`, it
//! prints "added" once the jobs are in and waits for a line on stdin before draining, so
//! that the caller can read Redis's figures between the two phases.
//!
//! Usage: wasq-bench-bullmq-rs REDIS_PORT N CONCURRENCY [bulk|single] [IN_FLIGHT] [sync]

use std::sync::Arc;
use std::time::Instant;

use bullmq::options::{QueueOptions, RedisConnectionOptions, WorkerOptions};
use bullmq::types::RemoveOnFinish;
use bullmq::worker::{CancellationToken, ProcessorFn, WorkerEvent};
use bullmq::{BulkJob, Job, Queue, Worker};

fn payload(i: usize) -> serde_json::Value {
    // {"i":N,"pad":"xxx…"}: 100 bytes of JSON for any N below 10^6.
    let pad = "x".repeat(100 - 17 - i.to_string().len());
    serde_json::json!({ "i": i, "pad": pad })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let port: u16 = args[0].parse()?;
    let n: usize = args[1].parse()?;
    let concurrency: usize = args[2].parse()?;
    let mode = args.get(3).map_or("bulk", String::as_str);
    let in_flight: usize = args.get(4).map_or(Ok(50), |v| v.parse())?;
    let connection = RedisConnectionOptions::new().host("127.0.0.1").port(port);
    let name = format!("bench-{}", std::process::id());
    let queue = Arc::new(
        Queue::with_options(
            &name,
            QueueOptions {
                connection: connection.clone(),
                ..QueueOptions::default()
            },
        )
        .await?,
    );

    let t0 = Instant::now();
    if mode == "single" {
        let mut tasks = tokio::task::JoinSet::new();
        for t in 0..in_flight {
            let queue = queue.clone();
            tasks.spawn(async move {
                for i in (t..n).step_by(in_flight) {
                    queue.add("noop", payload(i)).await.expect("add");
                }
            });
        }
        tasks.join_all().await;
    } else {
        for start in (0..n).step_by(1000) {
            let batch = (start..n.min(start + 1000))
                .map(|i| BulkJob::new("noop", payload(i)))
                .collect();
            queue.add_bulk(batch).await?;
        }
    }
    let enqueue_ms = t0.elapsed().as_secs_f64() * 1e3;
    if args.get(5).is_some_and(|a| a == "sync") {
        println!("added");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
    }

    let processor: ProcessorFn = Arc::new(|_job: Job, _token: CancellationToken| {
        Box::pin(async move { Ok(serde_json::json!({ "ok": true })) })
    });
    let worker = Worker::with_options(
        &name,
        processor,
        WorkerOptions {
            connection,
            concurrency,
            autorun: false,
            remove_on_complete: Some(RemoveOnFinish::Count(n)),
            ..WorkerOptions::default()
        },
    )
    .await?;
    let start = Instant::now();
    worker.run().await?;
    let mut done = 0;
    while done < n {
        match worker.next_event().await {
            Some(WorkerEvent::Completed { .. }) => done += 1,
            Some(WorkerEvent::Failed { error, .. }) => return Err(error.into()),
            Some(_) => {}
            None => return Err("the worker stopped".into()),
        }
    }
    let drain_ms = start.elapsed().as_secs_f64() * 1e3;
    worker.close(5_000).await?;
    queue.obliterate(true, 1000).await?;
    queue.close().await;
    println!(
        "{}",
        serde_json::json!({
            "system": "bullmq-rs", "n": n, "concurrency": concurrency, "mode": mode,
            "enqueue_ms": enqueue_ms, "drain_ms": drain_ms,
            "per_sec": n as f64 * 1e3 / drain_ms,
        })
    );
    Ok(())
}
