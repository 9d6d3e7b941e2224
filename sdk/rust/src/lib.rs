//! Write wasq jobs in Rust: the guest-side SDK of the wasq job runner.
//!
//! A wasq job is a WebAssembly component exporting `run` from the WIT world
//! `wasq:task/task@0.1.0` (the repository's `wit/task.wit`). This crate is a thin, ergonomic
//! layer over the [`wit-bindgen`](https://docs.rs/wit-bindgen) bindings of that world: you
//! write an ordinary function from a JSON input type to a JSON output type and register it
//! with [`task!`]; the crate parses the input, serialises the output, turns your [`Error`]
//! into the world's `run-error`, and wraps the host's durable steps, logs, progress and run
//! context in plain Rust functions.
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use wasq_guest::{info, step, Error};
//!
//! #[derive(Deserialize)]
//! struct In { user_id: u64 }
//!
//! #[derive(Serialize)]
//! struct Out { status: String }
//!
//! fn handler(input: In) -> Result<Out, Error> {
//!     let sent: bool = step::run("send-email", || {
//!         info!("sending the email for user {}", input.user_id);
//!         Ok(true)
//!     })?;
//!     Ok(Out { status: if sent { "sent".into() } else { "skipped".into() } })
//! }
//!
//! wasq_guest::task!(handler);
//! ```
//!
//! Build with `cargo build --target wasm32-wasip2 --release` in a `cdylib` crate: the
//! result in `target/wasm32-wasip2/release/<name>.wasm` is already a component.
//!
//! # Durable steps, and what re-runs
//!
//! A run may take several *attempts* (after a retryable error, a trap, or a host restart).
//! Every attempt calls your handler from the top. The body of a [`step::run`] that completed
//! in an earlier attempt is **not** run again: its stored output is returned instead.
//!
//! **Code outside steps re-runs on every attempt and must be deterministic**: it must take
//! the same path and begin the same steps in the same order each time (steps are matched by
//! name and by how many times that name was begun before in the attempt). Put every side
//! effect (sending a mail, charging a card, calling an API) and every non-deterministic value
//! (time, randomness) inside a step.
//!
//! # Key decision
//!
//! Everything crossing the host boundary is JSON through `serde`: the job input, the job
//! output and each step's output. That keeps stored step outputs and run outputs readable in
//! the CLI, API and dashboard, at the cost of requiring `Serialize`/`DeserializeOwned`.
//!
//! # What this crate is not
//!
//! - Not an async runtime: handlers and steps are plain synchronous functions.
//! - Not a way to reach the outside world at large: the host grants no files, environment
//!   variables or sockets; a job can do what this crate offers — including outbound HTTP
//!   ([`http`]) to the hosts its deploy allows — plus what `std` gets from WASI: clocks,
//!   random numbers, stdout and stderr.
//! - Not a workflow engine of its own: durable sleep ([`step::sleep`]), events
//!   ([`events`]) and child runs ([`runs`]) are host features; the SDK only names them.
//!
//! # Panics
//!
//! A panic prints to stderr a line `thread '<unnamed>' (1) panicked at <file>:<line>:<col>:`
//! then its message, which the host captures and reports, and then traps: the attempt fails
//! and is retried per the function's retry policy. Build guests with `panic = "abort"`: on
//! `wasm32-wasip2` stable Rust cannot unwind anyway (`"unwind"` builds, but traps the same
//! way), and the message is printed before the abort with either setting.
//!
//! # Serde
//!
//! [`serde`] and [`serde_json`] are re-exported (e.g. `wasq_guest::serde_json::json!`). To use
//! `#[derive(Serialize, Deserialize)]`, either depend on `serde` with its `derive` feature
//! directly (the derives expect a crate named `serde`), or derive through the re-export and
//! add `#[serde(crate = "wasq_guest::serde")]` to the type.

#![warn(missing_docs)]

pub mod context;
mod error;
pub mod events;
pub mod http;
pub mod log;
pub mod progress;
pub mod runs;
pub mod step;

pub use error::{Error, ErrorKind, ResultExt};
pub use serde;
pub use serde_json;

/// The raw `wit-bindgen` bindings of world `wasq:task/task`. Not a stable API: use the
/// wrappers in this crate.
#[doc(hidden)]
#[allow(missing_docs)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "wasq:task/task",
        // The WASI interfaces the world includes get bindings too (std does not need them,
        // but the generator requires every interface to be either generated or mapped).
        generate_all,
        // The export macro is used from the job's crate through `wasq_guest::task!`.
        pub_export_macro: true,
        export_macro_name: "export",
        default_bindings_module: "wasq_guest::bindings",
    });
}

/// Registers `handler` as the job's `run` export.
///
/// `handler` is any function or closure `fn(In) -> Result<Out, Error>` where
/// `In: serde::de::DeserializeOwned` and `Out: serde::Serialize`. Use it once per crate, at
/// item level:
///
/// ```no_run
/// fn handler(input: serde_json::Value) -> Result<serde_json::Value, wasq_guest::Error> {
///     Ok(input)
/// }
/// wasq_guest::task!(handler);
/// ```
///
/// - The input bytes are parsed as JSON into `In`; empty (or all-whitespace) input counts as
///   JSON `null`. A parse failure ends the run with the fatal error `invalid input: ...`
///   without calling `handler`.
/// - `Ok(out)` is serialised as JSON and becomes the run's output.
/// - `Err(error)` becomes the world's `run-error` (see [`Error`]).
#[macro_export]
macro_rules! task {
    ($handler:expr $(,)?) => {
        const _: () = {
            struct WasqTask;

            impl $crate::bindings::Guest for WasqTask {
                fn run(
                    input: ::std::vec::Vec<u8>,
                ) -> ::core::result::Result<::std::vec::Vec<u8>, $crate::bindings::RunError>
                {
                    $crate::__private::run(&input, $handler)
                }
            }

    $crate::bindings::export!(WasqTask with_types_in $crate::bindings);
        };
    };
}

/// Support code for the macros. Not a public API.
#[doc(hidden)]
pub mod __private {
    use crate::Error;
    use crate::bindings::RunError;
    use serde::Serialize;
    use serde::de::DeserializeOwned;

    /// Parses `input`, calls `handler` and encodes its result for the host.
    pub fn run<In, Out, F>(input: &[u8], handler: F) -> Result<Vec<u8>, RunError>
    where
        In: DeserializeOwned,
        Out: Serialize,
        F: FnOnce(In) -> Result<Out, Error>,
    {
        let input: In = parse_input(input).map_err(RunError::from)?;
        let output = handler(input).map_err(RunError::from)?;
        serde_json::to_vec(&output)
            .map_err(|e| RunError::from(Error::fatal(format!("cannot serialise output: {e}"))))
    }

    fn parse_input<In: DeserializeOwned>(input: &[u8]) -> Result<In, Error> {
        let parsed = if input.iter().all(u8::is_ascii_whitespace) {
            serde_json::from_slice(b"null")
        } else {
            serde_json::from_slice(input)
        };
        parsed.map_err(|e| Error::fatal(format!("invalid input: {e}")))
    }

    /// Writes a log line; used by the logging macros.
    pub fn log(level: crate::log::Level, message: core::fmt::Arguments<'_>) {
        match message.as_str() {
            Some(text) => crate::log::write(level, text),
            None => crate::log::write(level, &message.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::__private::run;
    use crate::Error;
    use crate::bindings::RunError;
    use serde_json::{Value, json};

    fn echo(input: Value) -> Result<Value, Error> {
        Ok(input)
    }

    #[test]
    fn input_and_output_are_json() {
        assert_eq!(run(br#"{"a":1}"#, echo).unwrap(), br#"{"a":1}"#);
        assert_eq!(run(b"", echo).unwrap(), b"null");
        assert_eq!(run(b" \n", |()| Ok(json!(7))).unwrap(), b"7");
    }

    #[test]
    fn bad_input_is_fatal() {
        let err = run(b"{nope", echo).unwrap_err();
        assert!(matches!(err, RunError::Fatal(m) if m.starts_with("invalid input: ")));
        let err = run(b"{}", |n: u32| Ok(n)).unwrap_err();
        assert!(matches!(err, RunError::Fatal(m) if m.starts_with("invalid input: ")));
    }

    #[test]
    fn handler_errors_pass_through() {
        let err = run(b"1", |_: u32| -> Result<(), Error> {
            Err(Error::retry_after_ms(5, "later"))
        });
        assert!(matches!(err, Err(RunError::RetryAfter((5, m))) if m == "later"));
    }
}
