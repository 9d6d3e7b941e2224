//! Retries resume where they failed: step "one" (logs "step one ran"), step "two" fails
//! with a retryable error while the attempt is below `{"succeed_on": N}`, step "three".
//! Output: the attempt each step body ran in.

use wasq_guest::serde::Deserialize;
use wasq_guest::serde_json::{Value, json};
use wasq_guest::{Error, context, info, step};

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    succeed_on: u32,
}

fn flaky(input: Input) -> Result<Value, Error> {
    let one: u32 = step::run("one", || {
        info!("step one ran");
        Ok(context::info().attempt)
    })?;
    let two: u32 = step::run("two", || {
        let attempt = context::info().attempt;
        if attempt < input.succeed_on {
            return Err(Error::retryable(format!("step two failed in attempt {attempt}")));
        }
        Ok(attempt)
    })?;
    let three: u32 = step::run("three", || Ok(context::info().attempt))?;
    Ok(json!({ "one": one, "two": two, "three": three }))
}

wasq_guest::task!(flaky);
