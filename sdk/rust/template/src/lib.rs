//! {{name}}: a wasq task. Input `{"name": "Ada"}`, output `{"greeting": "Hello, Ada!"}`.
//!
//! The greeting is made in a durable step: once it completed, a retry or a resume of the
//! run returns its stored output instead of running the body again. Code outside steps
//! re-runs on every attempt, so keep it deterministic.

use serde::{Deserialize, Serialize};
use wasq_guest::{Error, info, step};

#[derive(Deserialize)]
struct Input {
    name: String,
}

#[derive(Serialize)]
struct Output {
    greeting: String,
}

fn handler(input: Input) -> Result<Output, Error> {
    let greeting: String = step::run("greet", || {
        info!("greeting {}", input.name);
        Ok(format!("Hello, {}!", input.name))
    })?;
    Ok(Output { greeting })
}

wasq_guest::task!(handler);
