//! `send-welcome-email`: the typical side-effect job: one durable step that "sends" an email.
//!
//! Input `{"user_id": 42, "email": "ada@example.com"}`; output
//! `{"status": "sent", "user_id": 42}`. A missing or malformed field is a fatal error. The
//! example sends nothing for real (the host grants no sockets): it writes a log line instead.
//! Because the sending is a step, a retry after a later failure does not send twice.

use serde::{Deserialize, Serialize};
use wasq_guest::{Error, info, step};

/// The job's input.
#[derive(Deserialize)]
struct Input {
    user_id: u64,
    email: String,
}

/// The job's output.
#[derive(Serialize)]
struct Output {
    status: &'static str,
    user_id: u64,
}

fn send_welcome_email(input: Input) -> Result<Output, Error> {
    if !input.email.contains('@') {
        return Err(Error::fatal(format!(
            "not an email address: {:?}",
            input.email
        )));
    }
    step::run("send-email", || {
        info!(
            "sending welcome email to {} for user {}",
            input.email, input.user_id
        );
        Ok(())
    })?;
    Ok(Output {
        status: "sent",
        user_id: input.user_id,
    })
}

wasq_guest::task!(send_welcome_email);
