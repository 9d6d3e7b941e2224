//! Injected time, so schedulers, retention and lease expiry are testable without sleeping.
//!
//! Every part of wasq that reads the time — the stores, the server's API, worker,
//! scheduler and purge, the sandbox's sleeps, waits and log lines — reads one [`Clock`].
//! Loops that wait for a time wait through [`Clock::wait_until`], so a test that moves a
//! [`ManualClock`] moves them at once instead of sleeping.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// A future a clock returns.
pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> Millis;

    /// Returns once the clock reads `at` or later, or after `max` of real time, whichever
    /// comes first (callers look at the clock again either way).
    fn wait_until(&self, at: Millis, max: Duration) -> Sleep<'_> {
        let left = u64::try_from(at.saturating_sub(self.now_ms())).unwrap_or(0);
        Box::pin(tokio::time::sleep(max.min(Duration::from_millis(left))))
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as Millis)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to; whoever waits on it wakes when it moves.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Manual>);

#[derive(Debug)]
struct Manual {
    now: AtomicI64,
    moved: Notify,
}

impl ManualClock {
    pub fn new(start: Millis) -> Self {
        Self(Arc::new(Manual {
            now: AtomicI64::new(start),
            moved: Notify::new(),
        }))
    }
    pub fn advance(&self, ms: Millis) {
        self.0.now.fetch_add(ms, Ordering::SeqCst);
        self.0.moved.notify_waiters();
    }
    pub fn set(&self, ms: Millis) {
        self.0.now.store(ms, Ordering::SeqCst);
        self.0.moved.notify_waiters();
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.0.now.load(Ordering::SeqCst)
    }

    fn wait_until(&self, at: Millis, max: Duration) -> Sleep<'_> {
        Box::pin(async move {
            let timeout = tokio::time::sleep(max);
            tokio::pin!(timeout);
            loop {
                let moved = self.0.moved.notified();
                tokio::pin!(moved);
                moved.as_mut().enable();
                if self.now_ms() >= at {
                    return;
                }
                tokio::select! {
                    () = moved => {}
                    () = &mut timeout => return,
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_wakes_its_waiters_when_moved() {
        let clock = ManualClock::new(1_000);
        let waiter = {
            let clock = clock.clone();
            tokio::spawn(async move { clock.wait_until(5_000, Duration::from_secs(60)).await })
        };
        tokio::task::yield_now().await;
        clock.advance(1_000);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "not there yet");
        clock.set(5_000);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken by the move")
            .unwrap();
        // Already past: at once.
        clock.wait_until(10, Duration::from_secs(60)).await;
    }
}
