//! One durable effect, chosen by the input, for the tests of what an attempt that no longer
//! owns its run may do (nothing): `{"effect": "step" | "sleep" | "wait" | "invoke" | "call"
//! | "send" | "http", "url": "http://..."}`. `step` calls `url` from inside its body;
//! `http` calls it outside any step. Returns `{"done": EFFECT}`.
//!
//! And for the tests of when a completed step is stored: `step_then_http` completes step
//! `first`, then calls `url`; `step_then_compute` completes it, then computes for
//! `ms` milliseconds before it returns.

use std::time::Duration;

use wasq_guest::serde::Deserialize;
use wasq_guest::serde_json::{Value, json};
use wasq_guest::{Error, events, http, runs, step};

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    effect: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    ms: u64,
}

fn effects(input: Input) -> Result<Value, Error> {
    let url = input.url.as_str();
    match input.effect.as_str() {
        "step" => {
            step::run("body", || {
                http::get(url)?;
                Ok(())
            })?;
        }
        "sleep" => step::sleep("nap", Duration::from_secs(3600)),
        "wait" => {
            let _: Option<Value> = events::wait_for("wait", "go", None, None)?;
        }
        "invoke" => {
            runs::invoke("child", "echo", &json!({}))?;
        }
        "call" => {
            let _: Value = runs::call("child", "echo", &json!({}))?;
        }
        "send" => events::send("send", "hello", &json!({}))?,
        "http" => {
            http::get(url)?;
        }
        "step_then_http" => {
            step::run("first", || Ok(1))?;
            http::get(url)?;
        }
        "step_then_compute" => {
            step::run("first", || Ok(1))?;
            let start = std::time::Instant::now();
            let mut x: u64 = 0;
            while start.elapsed() < Duration::from_millis(input.ms) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        other => return Err(Error::fatal(format!("unknown effect {other:?}"))),
    }
    Ok(json!({ "done": input.effect }))
}

wasq_guest::task!(effects);
