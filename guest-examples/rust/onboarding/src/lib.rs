//! `onboarding`: welcome email → wait for the user to activate → re-engage if they did
//! not. The wait is a durable wait-for-event with a timeout: the run sleeps without a
//! worker for up to `activation_window_ms` (default three days) and wakes early when
//! `user.activated` arrives for this user.
//!
//! Input `{"user_id": 42, "email": "ada@example.com", "activation_window_ms": 259200000}`.
//! Output `{"user_id": 42, "status": "activated" | "re-engaged"}`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use wasq_guest::serde_json::{Value, json};
use wasq_guest::{Error, events, info, step};

#[derive(Deserialize)]
struct Input {
    user_id: u64,
    email: String,
    #[serde(default = "three_days")]
    activation_window_ms: u64,
}

fn three_days() -> u64 {
    3 * 24 * 3600 * 1000
}

#[derive(Serialize)]
struct Outcome {
    user_id: u64,
    status: &'static str,
}

fn onboarding(input: Input) -> Result<Outcome, Error> {
    step::run("send-welcome-email", || {
        info!("sending welcome email to {} (user {})", input.email, input.user_id);
        Ok(())
    })?;

    let activated: Option<Value> = events::wait_for(
        "wait-for-activation",
        "user.activated",
        Some(json!({ "user_id": input.user_id })),
        Some(Duration::from_millis(input.activation_window_ms)),
    )?;
    if activated.is_some() {
        info!("user {} activated", input.user_id);
        return Ok(Outcome { user_id: input.user_id, status: "activated" });
    }

    step::run("send-re-engagement-email", || {
        info!("user {} did not activate: sending a nudge to {}", input.user_id, input.email);
        Ok(())
    })?;
    Ok(Outcome { user_id: input.user_id, status: "re-engaged" })
}

wasq_guest::task!(onboarding);
