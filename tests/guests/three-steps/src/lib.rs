//! The chaos tests' job: three steps `a`, `b`, `c`, each logging "step X body ran" from
//! inside its body, with `pause_ms` spent outside the steps between them (where a killed
//! or paused worker leaves a half-finished run). With `count_url`, each step body also
//! sends `GET {count_url}?run=ID&step=X&attempt=N`: a side effect counted outside the store,
//! by the test's own HTTP server. Output: the attempt in which each step body ran, e.g.
//! `{"a": 1, "b": 1, "c": 2}`.

use std::time::Duration;
use wasq_guest::serde::{Deserialize, Serialize};
use wasq_guest::{Error, context, http, info, step};

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    #[serde(default)]
    pause_ms: u64,
    #[serde(default)]
    count_url: Option<String>,
}

#[derive(Serialize)]
#[serde(crate = "wasq_guest::serde")]
struct Output {
    a: u32,
    b: u32,
    c: u32,
}

fn body(name: &str, count_url: Option<&str>) -> Result<u32, Error> {
    step::run(name, || {
        let ctx = context::info();
        if let Some(url) = count_url {
            let url = format!(
                "{url}?run={}&step={name}&attempt={}",
                ctx.run_id, ctx.attempt
            );
            let resp = http::get(&url)?;
            if resp.status != 200 {
                return Err(Error::retryable(format!("counter answered {}", resp.status)));
            }
        }
        info!("step {name} body ran");
        Ok(ctx.attempt)
    })
}

fn three_steps(input: Input) -> Result<Output, Error> {
    let pause = Duration::from_millis(input.pause_ms);
    let url = input.count_url.as_deref();
    let a = body("a", url)?;
    std::thread::sleep(pause);
    let b = body("b", url)?;
    std::thread::sleep(pause);
    let c = body("c", url)?;
    Ok(Output { a, b, c })
}

wasq_guest::task!(three_steps);
