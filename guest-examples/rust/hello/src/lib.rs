//! `hello`: greets a name in two durable steps, logging and reporting progress on the way.
//!
//! Input `{"name": "Ada"}` (`name` optional, default `"world"`); output
//! `{"greeting": "Hello, Ada!", "shout": "HELLO, ADA!"}`. No input greets the world; input
//! that is not such an object (e.g. `{"name": 7}` or `[1]`) is a fatal error.

use serde::{Deserialize, Serialize};
use wasq_guest::{Error, info, progress, step};

/// The job's input.
#[derive(Deserialize)]
struct Input {
    /// Who to greet.
    #[serde(default = "default_name")]
    name: String,
}

fn default_name() -> String {
    "world".to_owned()
}

/// The job's output.
#[derive(Serialize)]
struct Output {
    greeting: String,
    shout: String,
}

fn hello(input: Option<Input>) -> Result<Output, Error> {
    // No input at all (JSON `null`) greets the world too.
    let input = input.unwrap_or_else(|| Input {
        name: default_name(),
    });
    let greeting: String = step::run("compose-greeting", || {
        info!("composing a greeting for {}", input.name);
        Ok(format!("Hello, {}!", input.name))
    })?;
    progress::report(50, Some("greeting composed"));

    let shout: String = step::run("shout", || {
        info!("shouting {greeting:?}");
        Ok(greeting.to_uppercase())
    })?;
    progress::report(100, Some("done"));

    Ok(Output { greeting, shout })
}

wasq_guest::task!(hello);
