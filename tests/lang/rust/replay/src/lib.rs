//! The replay task of tests/tests/languages.rs, in Rust: step one, a retryable failure on
//! the first attempt, step two. The retry must not run step one's body again. `left`: the
//! milliseconds the attempt had left (its soft deadline).

use wasq_guest::serde_json::{Value, json};
use wasq_guest::{Error, context, info, step};

fn handler(_input: Value) -> Result<Value, Error> {
    let one: u32 = step::run("one", || {
        info!("step one body ran");
        Ok(1)
    })?;
    if context::info().attempt == 1 {
        return Err(Error::retryable("fail once"));
    }
    let two: u32 = step::run("two", || {
        info!("step two body ran");
        Ok(2)
    })?;
    let left = context::time_left().as_millis() as u64;
    Ok(json!({"one": one, "two": two, "left": left}))
}

wasq_guest::task!(handler);
