//! The hostile-guest suite: each attack is a real component and must end contained, with a
//! clear run error or a bounded result, while the same daemon keeps serving a
//! well-behaved function.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasq_tests::{Api, Daemon, guest, wat_task};

const WAIT: Duration = Duration::from_secs(60);

/// Runs one attack as tenant `default`, then checks that another tenant's well-behaved
/// function is still served at once.
async fn attack(d: &Daemon, neighbour: &Api, name: &str) -> Value {
    attack_with(d, neighbour, json!({ "attack": name })).await
}

async fn attack_with(d: &Daemon, neighbour: &Api, input: Value) -> Value {
    let name = input["attack"].as_str().unwrap().to_owned();
    let started = Instant::now();
    let id = d.api.start_run("hostile", &input.to_string()).await;
    let run = d
        .api
        .wait_until(&id, WAIT, |r| {
            r["status"] != "queued" && r["status"] != "running"
        })
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{name} took {:?}",
        started.elapsed()
    );
    // The neighbour is served after every attack.
    let ok = neighbour
        .start_run("echo", &json!({ "after": name }).to_string())
        .await;
    let ok = neighbour.wait_run(&ok, WAIT).await;
    assert_eq!(ok["status"], "succeeded", "echo after {name}: {ok:#}");
    run
}

fn error(run: &Value) -> (&str, &str) {
    (
        run["error"]["reason"].as_str().unwrap_or(""),
        run["error"]["message"].as_str().unwrap_or(""),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_guests_are_contained() {
    let d = Daemon::start().await;
    let neighbour = d.admin.new_tenant("neighbour").await;
    neighbour.deploy("echo", guest("echo"), "").await;
    d.api
        .deploy(
            "hostile",
            guest("hostile"),
            "timeout_ms=2000&memory_bytes=67108864&max_attempts=1",
        )
        .await;

    let run = attack(&d, &neighbour, "recurse").await;
    assert_eq!(run["status"], "failed", "{run:#}");
    let (reason, message) = error(&run);
    assert_eq!(reason, "trap");
    // Rust's shadow stack lives in linear memory: overflowing it is an out-of-bounds
    // access; frames beyond the 1 MiB wasm stack are "call stack exhausted".
    assert!(
        message.contains("stack") || message.contains("out of bounds"),
        "{message}"
    );

    let run = attack(&d, &neighbour, "grow").await;
    assert_eq!(
        run["status"], "succeeded",
        "a refused memory.grow is just -1: {run:#}"
    );
    let grown = run["output"]["grown_bytes"].as_u64().unwrap();
    assert!(
        grown <= 64 << 20,
        "grew {grown} bytes past the 64 MiB limit"
    );

    let run = attack(&d, &neighbour, "handles").await;
    assert_eq!(run["status"], "failed", "{run:#}");
    assert!(error(&run).1.contains("handle limit"), "{run:#}");

    // It may finish or hit its time limit first: either way the log stays bounded.
    let run = attack(&d, &neighbour, "log-flood").await;
    assert!(
        matches!(run["status"].as_str(), Some("succeeded" | "failed")),
        "{run:#}"
    );
    let logs = d.api.logs(run["id"].as_str().unwrap()).await;
    let bytes: usize = logs
        .iter()
        .map(|l| l["message"].as_str().unwrap().len())
        .sum();
    assert!(
        bytes < 2 << 20,
        "64 MiB of output kept as {bytes} bytes of log"
    );
    assert!(
        logs.iter()
            .any(|l| l["message"].as_str().unwrap().contains("truncated")),
        "the truncation is said"
    );

    let run = attack(&d, &neighbour, "big-output").await;
    assert_eq!(run["status"], "failed");
    assert_eq!(error(&run).0, "fatal", "{run:#}");
    assert!(error(&run).1.contains("over the limit"), "{run:#}");

    // A string far past the memory limit cannot even be built; one that fits reaches
    // the host as a log line (cut to the log budget) and as a step name (refused).
    let run = attack(&d, &neighbour, "huge-host-call").await;
    assert_eq!(run["status"], "failed", "{run:#}");
    assert!(matches!(error(&run).0, "trap" | "out_of_memory"), "{run:#}");
    let run = attack_with(
        &d,
        &neighbour,
        json!({ "attack": "huge-host-call", "size": 24 << 20 }),
    )
    .await;
    assert_eq!(run["status"], "failed", "{run:#}");
    assert!(error(&run).1.contains("step name"), "{run:#}");
    let logs = d.api.logs(run["id"].as_str().unwrap()).await;
    let kept: usize = logs
        .iter()
        .map(|l| l["message"].as_str().unwrap().len())
        .sum();
    assert!(kept <= 2 << 20, "a 24 MiB log line kept as {kept} bytes");

    let run = attack(&d, &neighbour, "random").await;
    assert_eq!(
        run["status"], "failed",
        "2^40 random bytes must be refused: {run:#}"
    );

    let run = attack(&d, &neighbour, "sleep-forever").await;
    assert_eq!(
        error(&run).0,
        "timeout",
        "blocked in a host call, still stopped: {run:#}"
    );

    let id = d
        .api
        .start_run("hostile", r#"{"attack":"durable-sleep-forever"}"#)
        .await;
    let run = d
        .api
        .wait_until(&id, WAIT, |r| r["status"] == "sleeping")
        .await;
    assert!(
        run["due_at"].as_i64().unwrap() > 4_000_000_000_000,
        "asleep for good: {run:#}"
    );
    let (status, run) = d.api.post(&format!("/v1/runs/{id}/cancel"), "").await;
    assert_eq!((status, run["status"].as_str()), (200, Some("cancelled")));
    d.stop().await;
}

/// Guest log text is stored escaped, and a flood of lines ends at the per-attempt line
/// budget with one marker while the run goes on to succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_logs_are_escaped_and_bounded() {
    let d = Daemon::start().await;
    d.api
        .deploy(
            "hostile",
            guest("hostile"),
            "timeout_ms=30000&max_attempts=1",
        )
        .await;
    let logs = |id: String| {
        let api = d.api.clone();
        async move { api.logs(&id).await }
    };

    let id = d
        .api
        .start_run("hostile", r#"{"attack":"log-escapes"}"#)
        .await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    let lines = logs(id).await;
    let text = |source: &str| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l["source"] == source)
            .map(|l| l["message"].as_str().unwrap().to_owned())
            .collect()
    };
    for l in &lines {
        let m = l["message"].as_str().unwrap();
        assert!(
            !m.chars().any(|c| c.is_control() && c != '\t' && c != '\n'),
            "a control character was stored: {m:?}"
        );
    }
    assert_eq!(
        text("guest"),
        [r"\u{1b}[31mred\u{1b}[0m\n2024-01-01 INFO forged line\rover\u{7}\u{9b}2J\u{202e}evil"]
    );
    assert_eq!(
        text("stdout"),
        [r"\u{1b}]0;pwned title\u{7} nul:\u{0} del:\u{7f}"]
    );
    assert_eq!(text("stderr"), [r"\u{1b}[2J\u{1b}[Hcleared"]);

    let started = Instant::now();
    let id = d
        .api
        .start_run("hostile", r#"{"attack":"log-lines"}"#)
        .await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    assert_eq!(run["output"], "all lines written", "{run:#}");
    let lines = logs(id).await;
    let markers: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"].as_str().unwrap().contains("truncated"))
        .collect();
    assert_eq!(markers.len(), 1, "one marker: {markers:#?}");
    assert!(
        markers[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("log output truncated at 10000 lines"),
        "{markers:#?}"
    );
    let guest_lines = lines.iter().filter(|l| l["source"] != "host").count();
    assert_eq!(guest_lines, 10_000, "100,000 lines kept as {guest_lines}");
    println!(
        "log-lines: {} lines stored of 100,000 written, run took {:?}",
        lines.len(),
        started.elapsed()
    );
    d.stop().await;
}

/// A deployable component whose `run` first executes `body` (core wasm instructions that
/// leave an i32 on the stack: 0 = contained, anything else = the attack worked), then
/// returns `"contained"` or `"escaped"` as its output. Written in WAT because no guest
/// language lets code grow a table at will.
fn wat_attack(decls: &str, body: &str) -> Vec<u8> {
    wat_task(&format!(
        r#"
    (memory (export "memory") 1)
    {decls}
    (data (i32.const 100) "\"contained\"")
    (data (i32.const 120) "\"escaped\"")
    (global $heap (mut i32) (i32.const 1024))
    (func (export "cabi_realloc") (param i32 i32 i32) (param $size i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and (i32.add (global.get $heap) (i32.const 7)) (i32.const -8)))
      (global.set $heap (i32.add (local.get $p) (local.get $size)))
      (local.get $p))
    (func (export "run") (param i32 i32) (result i32)
      (i32.store8 (i32.const 0) (i32.const 0))
      (if ({body})
        (then (i32.store (i32.const 8) (i32.const 120)) (i32.store (i32.const 12) (i32.const 9)))
        (else (i32.store (i32.const 8) (i32.const 100)) (i32.store (i32.const 12) (i32.const 11))))
      (i32.const 0))"#
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_tables_are_refused() {
    let d = Daemon::start().await;
    let neighbour = d.admin.new_tenant("neighbour").await;
    neighbour.deploy("echo", guest("echo"), "").await;
    let run_it = |name: &'static str| {
        let api = d.api.clone();
        async move {
            let id = api.start_run(name, "{}").await;
            api.wait_run(&id, WAIT).await
        }
    };

    // table.grow by 100 million entries, then by one past the cap: both answer -1.
    let grow = wat_attack(
        "(table $t 1 funcref)",
        "i32.ne (table.grow $t (ref.null func) (i32.const 100000000)) (i32.const -1)",
    );
    d.api.deploy("table-grow", grow, "max_attempts=1").await;
    let run = run_it("table-grow").await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    assert_eq!(run["output"], "contained", "{run:#}");

    let creep = wat_attack(
        "(table $t 1 funcref)",
        "block $done (result i32) (loop $more \
           (if (i32.eq (table.grow $t (ref.null func) (i32.const 4096)) (i32.const -1)) \
             (then (br $done (i32.const 0)))) \
           (br_if $more (i32.lt_u (table.size $t) (i32.const 10000000)))) (i32.const 1)",
    );
    d.api.deploy("table-creep", creep, "max_attempts=1").await;
    let run = run_it("table-creep").await;
    assert_eq!(run["output"], "contained", "{run:#}");

    // A table declared huge from the start cannot be instantiated: the run fails, clearly.
    let declared = wat_attack("(table $t 100000000 funcref)", "i32.const 0");
    let (status, body) = d
        .api
        .put("/v1/functions/table-huge?max_attempts=1", declared)
        .await;
    if status == 201 {
        let run = run_it("table-huge").await;
        assert_eq!(run["status"], "failed", "{run:#}");
        let message = run["error"]["message"].as_str().unwrap();
        assert!(message.contains("table"), "{message}");
    } else {
        assert_eq!(status, 400, "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("table"),
            "{body}"
        );
    }

    let ok = neighbour.start_run("echo", r#"{"after": "tables"}"#).await;
    assert_eq!(neighbour.wait_run(&ok, WAIT).await["status"], "succeeded");
}
