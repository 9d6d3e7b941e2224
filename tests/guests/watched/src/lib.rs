//! A run to watch (`GET /v1/runs/{id}/events`) and to read its soft deadline: step "one",
//! a pause, step "two", a pause, progress 100% "done", a pause, then output
//! `{"left": N}`, the milliseconds the attempt had left of its time limit
//! (`context::time_left`). Input `{"pause_ms": N}` (default 300).

use std::time::Duration;
use wasq_guest::serde::Deserialize;
use wasq_guest::serde_json::{Value, json};
use wasq_guest::{Error, context, info, progress, step};

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    #[serde(default = "default_pause")]
    pause_ms: u64,
}

fn default_pause() -> u64 {
    300
}

fn watched(input: Input) -> Result<Value, Error> {
    let pause = || std::thread::sleep(Duration::from_millis(input.pause_ms));
    step::run("one", || {
        info!("step one ran");
        Ok(1)
    })?;
    pause();
    step::run("two", || {
        info!("step two ran");
        Ok(2)
    })?;
    pause();
    progress::report(100, Some("done"));
    pause();
    let left = context::time_left().as_millis() as u64;
    Ok(json!({ "left": left }))
}

wasq_guest::task!(watched);
