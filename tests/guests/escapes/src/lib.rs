//! Puts the caller's text `{"evil": "...", "wait_ms": N, "fail": bool}` everywhere a guest
//! can put text that wasq later shows: its progress message, a step name and output, a
//! log line and stdout, and its output or (`fail`) its fatal error message. With `wait_ms`
//! > 0 it waits for event `escapes.wait` that long first (event names follow the API's
//! rules, so none carries an escape: `hostile` tries). Tests send terminal escapes, forged
//! lines and bidi overrides and check that no terminal ever receives them raw.

use std::time::Duration;
use wasq_guest::serde::Deserialize;
use wasq_guest::serde_json::{Value, json};
use wasq_guest::{Error, events, info, progress, step};

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    evil: String,
    #[serde(default)]
    wait_ms: u64,
    #[serde(default)]
    fail: bool,
}

fn escapes(input: Input) -> Result<Value, Error> {
    let evil = input.evil;
    progress::report(50, Some(&format!("progress {evil}")));
    let said: String = step::run(&format!("step {evil}"), || Ok(format!("output {evil}")))?;
    info!("log {evil}");
    println!("stdout {evil}");
    if input.wait_ms > 0 {
        let timeout = Some(Duration::from_millis(input.wait_ms));
        let _: Option<Value> = events::wait_for("wait", "escapes.wait", None, timeout)?;
    }
    if input.fail {
        return Err(Error::fatal(format!("error {evil}")));
    }
    Ok(json!({ "said": said }))
}

wasq_guest::task!(escapes);
