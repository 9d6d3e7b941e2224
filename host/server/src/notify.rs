//! Signed webhooks (`wasq_core::notify`): the process that sees a run end (or an attempt
//! fail, when the function asks) adds its deliveries to the store; every server (`wasq
//! server`, `wasq dev`: the processes that share the server secret, which signs) runs a
//! sender that claims due deliveries, POSTs them through the sandbox's egress guard,
//! signed per Standard Webhooks, and records each try. A worker process only adds: a
//! server's sender finds its deliveries within [`POLL`].
//!
//! Signing: `webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`
//! with the tenant's secret (`whsec_<base64 key>`, `GET /v1/webhooks/secret`), derived
//! from the server secret: every server sharing a store signs with the same key, and no
//! secret is stored. A try is delivered on a 2xx answer; anything else (another status,
//! a refused destination, no answer within [`TRY_TIMEOUT`]) is retried on core's schedule.
//!
//! Like failure handlers, an end the store made by itself (a run failed by the cap on lost
//! leases inside a claim) or a process killed between the end and the add announces
//! nothing.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio_util::sync::CancellationToken;
use wasq_core::notify::{self, Delivery, DeliveryTry, Notice};
use wasq_core::{Run, RunError, RunStatus};

use crate::App;

/// How long one try may take, connection to answer.
pub(crate) const TRY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a claimed delivery is the sender's before another may take it.
const LEASE_MS: u64 = 60_000;
/// Deliveries sent at once by one process.
const IN_FLIGHT: usize = 16;
/// How often an idle sender looks for due deliveries (retries, and deliveries added by
/// other processes).
const POLL: Duration = Duration::from_secs(1);

/// Adds the deliveries of run `id`'s end, if it ended and its function notifies.
pub(crate) async fn after_end(app: &App, run: &Run, status: RunStatus) {
    if run.settings.notify.urls.is_empty() || !status.is_terminal() {
        return;
    }
    let ended = match app.store.run(&run.tenant, &run.id).await {
        Ok(Some(d)) => d.run,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(run = %run.id, error = %e, "cannot read the run to notify its end");
            return;
        }
    };
    add(app, notify::deliveries(&ended, Notice::Ended, app.now())).await;
}

/// Adds the deliveries of a failed attempt that will be retried, if the function asks.
pub(crate) async fn after_attempt_failed(app: &App, run: &Run, attempt: u32, error: &RunError) {
    let notice = Notice::AttemptFailed { attempt, error };
    add(app, notify::deliveries(run, notice, app.now())).await;
}

async fn add(app: &App, deliveries: Vec<Delivery>) {
    if deliveries.is_empty() {
        return;
    }
    match app.store.add_deliveries(deliveries).await {
        Ok(()) => app.deliveries.notify_one(),
        Err(e) => tracing::warn!(error = %e, "could not store webhook deliveries"),
    }
}

/// The tenant's signing key: HMAC of the server secret, so every server has it.
fn tenant_key(app: &App, tenant: &str) -> [u8; 32] {
    app.keyring.derive(&format!("webhook-secret:{tenant}"))
}

/// The tenant's webhook secret as receivers configure it.
pub(crate) fn tenant_secret(app: &App, tenant: &str) -> String {
    format!("whsec_{}", B64.encode(tenant_key(app, tenant)))
}

/// The Standard Webhooks signature of a message.
pub(crate) fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
}

/// The sender: claims due deliveries, sends them, records each try; until shutdown.
pub(crate) async fn run(app: Arc<App>, shutdown: CancellationToken) {
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    while !shutdown.is_cancelled() {
        let free = slots.available_permits();
        let claimed = if free == 0 {
            Vec::new()
        } else {
            match app.store.claim_deliveries(free, LEASE_MS).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "could not claim webhook deliveries");
                    Vec::new()
                }
            }
        };
        let got = claimed.len();
        for d in claimed {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let app = app.clone();
            tokio::spawn(async move {
                send(&app, d).await;
                drop(permit);
            });
        }
        if got > 0 && got == free {
            continue;
        }
        let now = app.now();
        tokio::select! {
            _ = app.deliveries.notified() => {}
            _ = app.config.clock.wait_until(now + POLL.as_millis() as i64, POLL) => {}
            _ = shutdown.cancelled() => {}
        }
    }
}

/// One try of one delivery, recorded under its claim.
async fn send(app: &App, d: Delivery) {
    let timestamp = app.now() / 1000;
    let signature = sign(&tenant_key(app, &d.tenant), &d.id, timestamp, &d.payload);
    let headers = [
        ("webhook-id", d.id.clone()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", signature),
    ];
    let sent = wasq_sandbox::post_webhook(
        &d.url,
        &headers,
        d.payload.clone(),
        TRY_TIMEOUT,
        app.config.sandbox.allow_loopback_egress,
    )
    .await;
    let error = match sent {
        Ok(status) if (200..300).contains(&status) => None,
        Ok(status) => Some(format!("HTTP {status}")),
        Err(e) => Some(e),
    };
    match &error {
        None => {
            tracing::info!(run = %d.run_id, url = %d.url, event = %d.event, "webhook delivered")
        }
        Some(e) => {
            tracing::warn!(run = %d.run_id, url = %d.url, error = %e, tries = d.tries + 1, "webhook try failed")
        }
    }
    let tried = DeliveryTry {
        tenant: d.tenant.clone(),
        id: d.id.clone(),
        token: d.token,
        error,
    };
    if let Err(e) = app.store.record_try(tried).await {
        tracing::warn!(error = %e, "could not record a webhook try; it will be tried again");
    }
    // A retry may be due before the sender's next poll.
    app.deliveries.notify_one();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification.
    #[test]
    fn signatures_follow_standard_webhooks() {
        let key = B64
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .expect("the spec's secret");
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            sign(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }
}
