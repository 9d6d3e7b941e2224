//! The multi-process crash test's job: three steps `a`, `b`, `c`, each logging
//! "step X body ran" from inside its body, with `pause_ms` spent outside the steps between
//! them (where a killed worker leaves a half-finished run). Output: the attempt in which
//! each step body ran, e.g. `{"a": 1, "b": 1, "c": 2}`.

use std::time::Duration;
use wasq_guest::serde::{Deserialize, Serialize};
use wasq_guest::{Error, context, info, step};

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    #[serde(default)]
    pause_ms: u64,
}

#[derive(Serialize)]
#[serde(crate = "wasq_guest::serde")]
struct Output {
    a: u32,
    b: u32,
    c: u32,
}

fn body(name: &str) -> Result<u32, Error> {
    step::run(name, || {
        info!("step {name} body ran");
        Ok(context::info().attempt)
    })
}

fn three_steps(input: Input) -> Result<Output, Error> {
    let pause = Duration::from_millis(input.pause_ms);
    let a = body("a")?;
    std::thread::sleep(pause);
    let b = body("b")?;
    std::thread::sleep(pause);
    let c = body("c")?;
    Ok(Output { a, b, c })
}

wasq_guest::task!(three_steps);
