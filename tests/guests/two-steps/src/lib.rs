//! Proves step durability across a host crash: input `{"pause_ms": N}` completes step "first"
//! (whose body logs "first step body ran"), sleeps N ms outside any step (the test kills the
//! daemon then), and runs step "second"; the body of "first" must run exactly once per run.
//! Output `{"first": {"attempt": A}, "second": {"attempt": B}}`, A and B being the attempt
//! numbers in which each step body ran.

use std::time::Duration;
use wasq_guest::serde::{Deserialize, Serialize};
use wasq_guest::{Error, context, info, step};

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    #[serde(default)]
    pause_ms: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct StepOutput {
    attempt: u32,
}

#[derive(Serialize)]
#[serde(crate = "wasq_guest::serde")]
struct Output {
    first: StepOutput,
    second: StepOutput,
}

fn two_steps(input: Input) -> Result<Output, Error> {
    let first = step::run("first", || {
        info!("first step body ran");
        Ok(StepOutput {
            attempt: context::info().attempt,
        })
    })?;
    // Outside any step: on wasm32-wasip2 this blocks in wasi:clocks/monotonic-clock +
    // wasi:io/poll, i.e. in the host, where the test can kill the daemon.
    std::thread::sleep(Duration::from_millis(input.pause_ms));
    let second = step::run("second", || {
        Ok(StepOutput {
            attempt: context::info().attempt,
        })
    })?;
    Ok(Output { first, second })
}

wasq_guest::task!(two_steps);
