//! How a failed attempt is retried: the policy a function (or a run) sets, its backoff
//! and jitter, and which errors it retries at all.

use serde::{Deserialize, Serialize};

use crate::model::ErrorReason;

/// How the delay between attempts grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Backoff {
    /// `initial_backoff_ms`, doubled per retry, capped at `max_backoff_ms`.
    #[default]
    Exponential,
    /// Always `initial_backoff_ms`.
    Fixed,
}

/// How a failed attempt is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RetryPolicy {
    /// Attempts in all, the first included; 1 means never retry.
    pub max_attempts: u32,
    /// Delay before the second attempt.
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
    #[serde(default)]
    pub backoff: Backoff,
    /// Spread each delay randomly over [delay/2, delay], so that runs failing together
    /// (an outage) do not retry together.
    #[serde(default = "yes")]
    pub jitter: bool,
    /// Whether traps (timeout, fuel, memory, panic) are retried; the guest's own
    /// `retryable` errors always are, `fatal` ones never.
    #[serde(default = "yes")]
    pub retry_traps: bool,
}

fn yes() -> bool {
    true
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff_ms: 1_000,
            max_backoff_ms: 60_000,
            backoff: Backoff::Exponential,
            jitter: true,
            retry_traps: true,
        }
    }
}

impl RetryPolicy {
    /// Attempts a policy may allow at most.
    pub const MAX_ATTEMPTS: u32 = 100;

    /// Checks the policy as the API, the CLI and the manifest accept it.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=Self::MAX_ATTEMPTS).contains(&self.max_attempts) {
            return Err(format!(
                "max_attempts must be between 1 and {}, got {}",
                Self::MAX_ATTEMPTS,
                self.max_attempts
            ));
        }
        if self.initial_backoff_ms > self.max_backoff_ms {
            return Err("initial_backoff_ms must not exceed max_backoff_ms".into());
        }
        Ok(())
    }

    /// Delay before attempt `next_attempt` (2 for the first retry), before jitter, or
    /// `None` when the policy is exhausted.
    pub fn backoff_before(&self, next_attempt: u32) -> Option<u64> {
        if next_attempt > self.max_attempts {
            return None;
        }
        let delay = match self.backoff {
            Backoff::Fixed => self.initial_backoff_ms,
            Backoff::Exponential => {
                let doublings = next_attempt.saturating_sub(2).min(32);
                self.initial_backoff_ms.saturating_mul(1u64 << doublings)
            }
        };
        Some(delay.min(self.max_backoff_ms))
    }

    /// When a failed attempt is retried: `None` = never (policy exhausted, or an error
    /// the policy does not retry). `rand01` in [0, 1) drives the jitter;
    /// `retry_after_ms`, from the guest, is a lower bound.
    pub fn retry_delay(
        &self,
        failed_attempt: u32,
        reason: ErrorReason,
        retry_after_ms: Option<u64>,
        rand01: f64,
    ) -> Option<u64> {
        let retried = match reason {
            ErrorReason::Fatal => false,
            ErrorReason::Retryable | ErrorReason::RetryAfter => true,
            ErrorReason::Timeout
            | ErrorReason::OutOfFuel
            | ErrorReason::OutOfMemory
            | ErrorReason::Trap => self.retry_traps,
            ErrorReason::LeaseExpired | ErrorReason::Host => true,
            ErrorReason::RateLimited
            | ErrorReason::Debounced
            | ErrorReason::StorageQuota
            | ErrorReason::Cancelled => false,
        };
        if !retried {
            return None;
        }
        let delay = self.backoff_before(failed_attempt + 1)?;
        let delay = if self.jitter {
            delay / 2 + ((delay - delay / 2) as f64 * rand01) as u64
        } else {
            delay
        };
        Some(delay.max(retry_after_ms.unwrap_or(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let p = RetryPolicy {
            max_attempts: 5,
            initial_backoff_ms: 100,
            max_backoff_ms: 350,
            ..RetryPolicy::default()
        };
        assert_eq!(p.backoff_before(2), Some(100));
        assert_eq!(p.backoff_before(3), Some(200));
        assert_eq!(p.backoff_before(4), Some(350));
        assert_eq!(p.backoff_before(5), Some(350));
        assert_eq!(p.backoff_before(6), None);
        let fixed = RetryPolicy {
            backoff: Backoff::Fixed,
            ..p
        };
        assert_eq!(fixed.backoff_before(4), Some(100));
    }

    #[test]
    fn retry_delay_follows_reason_jitter_and_retry_after() {
        let p = RetryPolicy {
            max_attempts: 3,
            initial_backoff_ms: 1000,
            max_backoff_ms: 10_000,
            ..RetryPolicy::default()
        };
        assert_eq!(p.retry_delay(1, ErrorReason::Fatal, None, 0.5), None);
        assert_eq!(
            p.retry_delay(3, ErrorReason::Retryable, None, 0.5),
            None,
            "exhausted"
        );
        assert_eq!(
            p.retry_delay(1, ErrorReason::Trap, None, 0.0),
            Some(500),
            "jitter floor"
        );
        assert_eq!(p.retry_delay(1, ErrorReason::Trap, None, 0.999), Some(999));
        assert_eq!(
            p.retry_delay(2, ErrorReason::Retryable, None, 0.0),
            Some(1000)
        );
        assert_eq!(
            p.retry_delay(1, ErrorReason::RetryAfter, Some(5000), 0.0),
            Some(5000)
        );
        let exact = RetryPolicy {
            jitter: false,
            retry_traps: false,
            ..p
        };
        assert_eq!(
            exact.retry_delay(1, ErrorReason::Retryable, None, 0.7),
            Some(1000)
        );
        assert_eq!(
            exact.retry_delay(1, ErrorReason::Timeout, None, 0.7),
            None,
            "traps not retried"
        );
    }

    #[test]
    fn validation_bounds_attempts_and_backoff() {
        let ok = RetryPolicy::default();
        assert!(ok.validate().is_ok());
        let none = RetryPolicy {
            max_attempts: 0,
            ..ok
        };
        assert_eq!(
            none.validate().unwrap_err(),
            "max_attempts must be between 1 and 100, got 0"
        );
        let inverted = RetryPolicy {
            initial_backoff_ms: 2,
            max_backoff_ms: 1,
            ..ok
        };
        assert!(inverted.validate().unwrap_err().contains("must not exceed"));
    }
}
