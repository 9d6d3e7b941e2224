//! A hostile guest with one attack per input `{"attack": "..."}`; each must end contained
//! (a clear run error, or a bounded result) while the daemon keeps serving others.
//! - `recurse`: unbounded recursion (the wasm stack limit).
//! - `grow`: memory.grow page by page until refused; returns the bytes it got.
//! - `handles`: creates WASI pollables without dropping them (host-side resource table).
//! - `log-flood`: 64 MiB of log lines and stdout (the per-attempt log budget).
//! - `log-lines`: 100,000 short log lines and stdout lines (the per-attempt line budget);
//!   returns once done, so the run must go on past the budget.
//! - `log-escapes`: ANSI escape sequences, CR/LF, BEL, NUL, C1 controls and a bidi
//!   override in log lines and on stdout/stderr (they must be stored escaped).
//! - `big-output`: an 8 MiB output value (over the 4 MiB output cap).
//! - `random`: get-random-bytes(2^40) straight through the WASI import.
//! - `sleep-forever`: std::thread::sleep(u64::MAX ms) blocked inside a host call.
//! - `durable-sleep-forever`: a durable sleep of u64::MAX ms.
//! - `big-steps`: `count` steps (default 100) of `size` bytes each (default 4,000,000), to
//!   pile up storage (the run's `max_run_bytes`).
//! - `log-and-fail`: `count` log lines (default 10,000), then a retryable error (the
//!   run's log budget over all its attempts).
//! - `fork`: invokes `count` children of function `child` (default `hostile`) that fork in
//!   turn (the tenant's max_queued, for children).
//! - `huge-event-name`: waits for an event named by `size` bytes (default 20,000,000).
//! - `bad-event-name`: sends an event with a name the API would refuse, escape included.

use std::hint::black_box;
use std::time::Duration;
use wasq_guest::bindings::wasi;
use wasq_guest::serde::Deserialize;
use wasq_guest::serde_json::{Value, json};
use wasq_guest::{Error, events, info, runs, step};

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    attack: String,
    /// Bytes of the string `huge-host-call` passes to host calls; of each step (`big-steps`).
    #[serde(default)]
    size: Option<usize>,
    /// How many steps, lines or children.
    #[serde(default)]
    count: Option<usize>,
    /// The function `fork` invokes.
    #[serde(default)]
    child: Option<String>,
}

#[inline(never)]
fn recurse(n: u64) -> u64 {
    let pad = black_box([n; 16]);
    if black_box(n) == u64::MAX { 0 } else { recurse(n + 1) + pad[3] }
}

fn hostile(input: Input) -> Result<Value, Error> {
    match input.attack.as_str() {
        "recurse" => Ok(json!(recurse(0))),
        "grow" => {
            let mut pages = 0usize;
            while core::arch::wasm32::memory_grow(0, 1) != usize::MAX {
                pages += 1;
            }
            Ok(json!({ "grown_bytes": pages * 65536 }))
        }
        "handles" => {
            for _ in 0..10_000_000u64 {
                let p = wasi::clocks::monotonic_clock::subscribe_duration(1_000_000_000);
                std::mem::forget(p);
            }
            Ok(json!("all handles created"))
        }
        "log-flood" => {
            let line = "x".repeat(1024);
            for i in 0..65_536 {
                info!("{i} {line}");
                println!("{i} {line}");
            }
            Ok(json!("flooded"))
        }
        "log-lines" => {
            for i in 0..50_000 {
                info!("line {i}");
                println!("out {i}");
            }
            Ok(json!("all lines written"))
        }
        "log-escapes" => {
            info!("\x1b[31mred\x1b[0m\n2024-01-01 INFO forged line\rover\x07\u{9b}2J\u{202e}evil");
            println!("\x1b]0;pwned title\x07 nul:\x00 del:\x7f");
            eprintln!("\x1b[2J\x1b[Hcleared");
            Ok(json!("escaped"))
        }
        "big-output" => Ok(json!("y".repeat(8 << 20))),
        "huge-host-call" => {
            // 1 GiB by default: past any memory limit, so building it already fails; a
            // smaller one reaches the host as a log line and as a step name.
            let huge = "z".repeat(input.size.unwrap_or(1 << 30));
            info!("{huge}");
            let n = step::run(&huge, || Ok(1))?;
            Ok(json!(n))
        }
        "random" => {
            let bytes = wasi::random::random::get_random_bytes(1 << 40);
            Ok(json!(bytes.len()))
        }
        "sleep-forever" => {
            std::thread::sleep(Duration::from_millis(u64::MAX));
            Ok(json!("woke"))
        }
        "durable-sleep-forever" => {
            step::sleep("forever", Duration::from_millis(u64::MAX));
            Ok(json!("woke"))
        }
        "big-steps" => {
            let size = input.size.unwrap_or(4_000_000);
            for i in 0..input.count.unwrap_or(100) {
                step::run(&format!("big-{i}"), || Ok("s".repeat(size)))?;
            }
            Ok(json!("all steps stored"))
        }
        "log-and-fail" => {
            for i in 0..input.count.unwrap_or(10_000) {
                info!("line {i} of an attempt that fails");
            }
            Err(Error::retryable("failing on purpose"))
        }
        "fork" => {
            let child = input.child.as_deref().unwrap_or("hostile");
            for i in 0..input.count.unwrap_or(10) {
                let me = json!({ "attack": "fork", "count": input.count, "child": child });
                runs::invoke(&format!("fork-{i}"), child, &me)?;
            }
            Ok(json!("forked"))
        }
        "huge-event-name" => {
            let name = "e".repeat(input.size.unwrap_or(20_000_000));
            let got: Option<Value> = events::wait_for("huge", &name, None, None)?;
            Ok(json!(got))
        }
        "bad-event-name" => {
            events::send("bad", "bad name {x}:\x1b]0;OWNED\x07", &json!({}))?;
            Ok(json!("sent"))
        }
        other => Err(Error::fatal(format!("unknown attack {other:?}"))),
    }
}

wasq_guest::task!(hostile);
