//! Cron triggers: which ticks of a function's schedule fall in a time window, and the
//! loop that starts a run for each.
//!
//! Exactly once per tick, even with several servers: every tick is enqueued with the
//! idempotency key `cron:<expression>:<tick ms>`, so the store keeps the first and answers
//! the others with it. Time zones and daylight saving follow croner (OCPS / Vixie cron):
//! a fixed-time tick inside a spring-forward gap fires right after the gap; in a
//! fall-back overlap it fires once; interval ticks (`*/15`) in a gap are skipped.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use tokio_util::sync::CancellationToken;
use wasq_core::clock::Millis;
use wasq_core::*;

use crate::App;

/// Ticks fired per schedule per pass at most: a `* * * * * *` schedule after a long
/// stall does not flood the queue.
const MAX_TICKS_PER_PASS: usize = 100;

/// A parsed schedule entry.
pub(crate) struct Entry {
    pub expr: String,
    cron: Cron,
    tz: Tz,
}

/// Parses and checks a schedule; the error names the bad expression or zone.
pub(crate) fn parse(schedule: &Schedule) -> Result<Vec<Entry>, String> {
    let tz = Tz::from_str(&schedule.tz).map_err(|_| {
        format!(
            "unknown time zone {:?} (use an IANA name such as America/New_York)",
            schedule.tz
        )
    })?;
    if schedule.crons.is_empty() {
        return Err("a schedule needs at least one cron expression".into());
    }
    schedule
        .crons
        .iter()
        .map(|expr| {
            let cron = Cron::from_str(expr)
                .map_err(|e| format!("invalid cron expression {expr:?}: {e}"))?;
            Ok(Entry {
                expr: expr.clone(),
                cron,
                tz,
            })
        })
        .collect()
}

fn at(ms: Millis, tz: Tz) -> DateTime<Tz> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or_default()
        .with_timezone(&tz)
}

impl Entry {
    /// Ticks in (after, until], oldest first, at most `limit`.
    pub(crate) fn ticks(&self, after: Millis, until: Millis, limit: usize) -> Vec<Millis> {
        let mut out = vec![];
        let mut from = at(after, self.tz);
        while out.len() < limit {
            let Ok(next) = self.cron.find_next_occurrence(&from, false) else {
                break;
            };
            let ms = next.timestamp_millis();
            if ms > until {
                break;
            }
            out.push(ms);
            from = next;
        }
        out
    }

    /// The next `n` ticks after `after`.
    pub(crate) fn upcoming(&self, after: Millis, n: usize) -> Vec<Millis> {
        self.ticks(after, i64::MAX, n)
    }

    /// The latest tick at or before `now`, if any.
    fn latest(&self, now: Millis) -> Option<Millis> {
        self.cron
            .find_previous_occurrence(&at(now, self.tz), true)
            .ok()
            .map(|t| t.timestamp_millis())
    }
}

/// Starts a run for every tick of every active schedule, once a second, until shutdown.
pub(crate) async fn run(app: Arc<App>, shutdown: CancellationToken) {
    // Per (tenant, function, expression): ticks up to here are done.
    let mut done: HashMap<(String, String, String), Millis> = HashMap::new();
    loop {
        let now = SystemClock.now_ms();
        if let Err(e) = pass(&app, &mut done, now).await {
            tracing::warn!(error = %e, "cron pass failed; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(1000 - (now % 1000) as u64 + 5)) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

async fn pass(
    app: &App,
    done: &mut HashMap<(String, String, String), Millis>,
    now: Millis,
) -> Result<(), StoreError> {
    let mut functions = Vec::new();
    for tenant in app.directory.tenants().await? {
        functions.extend(app.store.functions(&tenant.name).await?);
    }
    for f in functions {
        let Some(schedule) = f.schedule.as_ref().filter(|s| !s.paused) else {
            continue;
        };
        let Ok(entries) = parse(schedule) else {
            continue;
        };
        for entry in entries {
            let key = (f.tenant.clone(), f.name.clone(), entry.expr.clone());
            // First sight (start-up or a new deploy): nothing before now, except the latest
            // missed tick when the schedule asks for it (its key dedups it if it did fire).
            let after = *done
                .entry(key.clone())
                .or_insert_with(|| match schedule.missed {
                    Missed::Latest => entry.latest(now).map_or(now, |t| t - 1),
                    Missed::Skip => now,
                });
            for tick in entry.ticks(after, now, MAX_TICKS_PER_PASS) {
                fire(app, &f, &entry, tick).await?;
                done.insert(key.clone(), tick);
            }
            done.insert(key, now.max(after));
        }
    }
    Ok(())
}

async fn fire(app: &App, f: &Function, entry: &Entry, tick: Millis) -> Result<(), StoreError> {
    let when = at(tick, Tz::UTC).to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let enqueued = app
        .store
        .enqueue(EnqueueRequest {
            tenant: f.tenant.clone(),
            function: f.name.clone(),
            input: serde_json::json!({ "cron": entry.expr, "scheduled_at": when })
                .to_string()
                .into_bytes(),
            trigger: format!("cron:{}@{when}", entry.expr),
            due_at: None,
            idempotency_key: Some(format!("cron:{}:{tick}", entry.expr)),
            retry: None,
            parent: None,
            priority: None,
        })
        .await?;
    if enqueued.created {
        tracing::info!(function = %f.name, cron = %entry.expr, at = %when, "cron tick");
        app.wake.notify_one();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(expr: &str, tz: &str) -> Entry {
        let s = Schedule {
            crons: vec![expr.into()],
            tz: tz.into(),
            missed: Missed::Skip,
            paused: false,
        };
        parse(&s).unwrap().remove(0)
    }

    fn ms(rfc3339: &str) -> Millis {
        DateTime::parse_from_rfc3339(rfc3339)
            .unwrap()
            .timestamp_millis()
    }

    fn utc(ms: Millis) -> String {
        at(ms, Tz::UTC).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    }

    #[test]
    fn seconds_field_ticks_every_second() {
        let e = entry("*/1 * * * * *", "UTC");
        let t0 = ms("2026-01-01T00:00:00.500Z");
        let ticks = e.ticks(t0, t0 + 10_000, 100);
        assert_eq!(ticks.len(), 10);
        assert_eq!(utc(ticks[0]), "2026-01-01T00:00:01Z");
        assert!(ticks.windows(2).all(|w| w[1] - w[0] == 1000));
    }

    #[test]
    fn new_york_around_the_spring_and_autumn_changes() {
        // 2026-03-08: 02:00 EST jumps to 03:00 EDT. A 02:30 daily job fires right after the
        // gap, at 03:00 EDT (07:00Z); the day before at 02:30 EST (07:30Z), after at 06:30Z.
        let e = entry("30 2 * * *", "America/New_York");
        let got: Vec<_> = e
            .ticks(ms("2026-03-07T00:00:00Z"), ms("2026-03-10T00:00:00Z"), 10)
            .into_iter()
            .map(utc)
            .collect();
        assert_eq!(
            got,
            [
                "2026-03-07T07:30:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-09T06:30:00Z"
            ]
        );
        // 2026-11-01: 02:00 EDT falls back to 01:00 EST. A 01:30 job fires once, at the first
        // 01:30 (EDT, 05:30Z).
        let e = entry("30 1 * * *", "America/New_York");
        let got: Vec<_> = e
            .ticks(ms("2026-10-31T12:00:00Z"), ms("2026-11-02T12:00:00Z"), 10)
            .into_iter()
            .map(utc)
            .collect();
        assert_eq!(got, ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]);
    }

    #[test]
    fn bad_schedules_are_named() {
        let bad = |crons: &[&str], tz: &str| {
            let s = Schedule {
                crons: crons.iter().map(|c| c.to_string()).collect(),
                tz: tz.into(),
                missed: Missed::Skip,
                paused: false,
            };
            parse(&s).err().unwrap()
        };
        assert!(bad(&["61 * * * *"], "UTC").contains("\"61 * * * *\""));
        assert!(bad(&["* * * * *"], "Mars/Olympus").contains("unknown time zone"));
        assert!(bad(&[], "UTC").contains("at least one"));
    }

    #[test]
    fn latest_finds_the_tick_to_catch_up() {
        let e = entry("0 9 * * *", "UTC");
        assert_eq!(
            e.latest(ms("2026-01-02T10:00:00Z")).map(utc).as_deref(),
            Some("2026-01-02T09:00:00Z")
        );
        assert_eq!(
            e.upcoming(ms("2026-01-02T10:00:00Z"), 2)
                .into_iter()
                .map(utc)
                .collect::<Vec<_>>(),
            ["2026-01-03T09:00:00Z", "2026-01-04T09:00:00Z"]
        );
    }
}
