//! Cron triggers: the loop that starts a run for each tick of each active schedule.
//!
//! Exactly once per tick, even with several servers: every tick is enqueued with the
//! idempotency key `cron:<expression>:<tick ms>`, so the store keeps the first and answers
//! the others with it. Expressions, time zones and bounded tick searches are `cron.rs`'s.
//!
//! A pass runs [`LEAD_MS`] before each second turns and enqueues that second's ticks as
//! runs due at their tick: they start on time, not after the pass.
//!
//! Tenants are kept apart (issue 10, findings 3 and 4): each has its own task, so one
//! tenant's full queue, failing store calls or many schedules delay nobody else's ticks.
//! Tick searches run on a blocking thread, at most [`SEARCH_BUDGET`] per tenant per pass;
//! what does not fit waits for the next pass, which starts where this one stopped. Within a
//! tenant an error stays with its tick:
//! - a tick the tenant's quota refuses (`max_queued`) is skipped, and logged with a count
//!   at most once a minute per expression;
//! - a tick the store cannot take now (unavailable) stays pending and the next pass retries
//!   it, until it is [`STALE_MS`] late: then the missed policy takes over;
//! - any other error (a bug, corrupt data, the function deleted meanwhile) drops the tick
//!   with an error line, since retrying would not help.
//!
//! Missed ticks (finding 5): the ticks of a paused schedule (up to `Schedule::resumed_at`),
//! those before a schedule is first seen by this process, and those still pending
//! [`STALE_MS`] after they were due (store outage, stalled process) are missed: the
//! function's `missed` policy decides what fires of them, `skip` none, `latest` the latest
//! one, once.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use wasq_core::clock::Millis;
use wasq_core::*;

use crate::App;
use crate::cron::{self, Entry, Next};

/// How long before its tick a tick's run is enqueued (due at the tick: it does not start
/// before). Enqueueing a second's ticks just after it turned made them late by the pass
/// itself: the wake-up, reading the schedules, and one enqueue per tick (25 ticks on one
/// second: a run started 8 ms after its tick at the median on `wasq dev`). The price: a
/// pause or redeploy less than this before a tick does not stop that tick's run.
const LEAD_MS: Millis = 100;
/// Ticks queued per expression per pass at most: a `* * * * * *` schedule catching up
/// does not flood the queue in one go.
const MAX_TICKS_PER_PASS: usize = 100;
/// A tenant's tick enqueues in flight at once.
const FIRE_IN_FLIGHT: usize = 64;
/// A tick still pending this long after it was due is missed (the policy decides).
const STALE_MS: Millis = 60_000;
/// Tick searching per tenant per pass.
const SEARCH_BUDGET: Duration = Duration::from_millis(100);
/// Skipped ticks are logged at most this often per expression.
const REFUSAL_LOG_EVERY_MS: Millis = 60_000;
/// How far back `latest` looks when a schedule is first seen.
const LOOKBACK_MS: Millis = cron::SEARCH_YEARS as Millis * 366 * 24 * 3600 * 1000;

/// Keeps one scheduling task per tenant until shutdown.
pub(crate) async fn run(app: Arc<App>, shutdown: CancellationToken) {
    let mut tasks: HashMap<String, JoinHandle<()>> = HashMap::new();
    loop {
        match app.store.tenants().await {
            Ok(tenants) => {
                let names: HashSet<String> = tenants.into_iter().map(|t| t.name).collect();
                tasks.retain(|name, task| {
                    // A finished task panicked: it starts again, as if the server restarted.
                    let keep = names.contains(name) && !task.is_finished();
                    if !keep {
                        task.abort();
                    }
                    keep
                });
                for name in names {
                    if let std::collections::hash_map::Entry::Vacant(slot) =
                        tasks.entry(name.clone())
                    {
                        slot.insert(tokio::spawn(tenant_loop(
                            app.clone(),
                            name,
                            shutdown.clone(),
                        )));
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cron: cannot list tenants; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.cancelled() => break,
        }
    }
    for task in tasks.into_values() {
        let _ = task.await;
    }
}

/// One tenant's schedules, once a second, [`LEAD_MS`] before the second turns: the pass
/// enqueues that second's ticks ahead, as runs due at their tick.
async fn tenant_loop(app: Arc<App>, tenant: String, shutdown: CancellationToken) {
    let mut state = TenantState::default();
    // The second whose ticks the next pass enqueues.
    let mut second = (app.now().div_euclid(1000) + 1) * 1000;
    loop {
        let now = app.now();
        // The clock's wait also returns after a while of real time (on a manual clock that
        // did not move, say): that pass enqueues nothing ahead.
        let ahead = now >= second - LEAD_MS;
        let at = Window {
            now,
            horizon: if ahead { second.max(now) } else { now },
        };
        state = pass(&app, &tenant, state, at).await;
        if ahead {
            second = (at.horizon.div_euclid(1000) + 1) * 1000;
        }
        tokio::select! {
            _ = app.config.clock.wait_until(second - LEAD_MS, Duration::from_millis(1005)) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// When a pass runs: the clock's time, and up to when it enqueues ticks (`now`, or the
/// second it runs ahead of: ticks not due yet become runs due at their tick).
#[derive(Debug, Clone, Copy)]
struct Window {
    now: Millis,
    horizon: Millis,
}

/// Finds the ticks due within `at` and enqueues them.
async fn pass(app: &App, tenant: &str, state: TenantState, at: Window) -> TenantState {
    // Only the scheduled functions: a tenant's other functions, however many, cost the
    // pass nothing (`Registry::schedules` reads an index of them).
    let scheduled = match app.store.schedules(tenant).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(tenant, error = %e, "cron: cannot list the tenant's schedules; retrying");
            return state;
        }
    };
    let name = tenant.to_owned();
    let planned = tokio::task::spawn_blocking(move || {
        let mut state = state;
        state.plan(&name, scheduled, at, Instant::now() + SEARCH_BUDGET);
        state
    })
    .await;
    let mut state = match planned {
        Ok(state) => state,
        Err(e) => {
            tracing::error!(tenant, error = %e, "cron: searching ticks failed; starting over");
            return TenantState::default();
        }
    };
    state.fire(app, tenant, at).await;
    state
}

/// What the scheduler knows of one tenant's schedules.
struct TenantState {
    /// By function name.
    functions: BTreeMap<String, Tracked>,
    /// Where the next pass's searches start, so a budget cut favours no schedule.
    rotate: usize,
    budget_logged_at: Millis,
}

struct Tracked {
    schedule: Schedule,
    cursors: Vec<Cursor>,
}

/// One expression's progress.
struct Cursor {
    entry: Entry,
    /// Every tick at or before this is handled, except those in `due`.
    done: Millis,
    /// Ticks found and not yet handled, oldest first.
    due: VecDeque<Millis>,
    /// Every tick in (`done`, `searched_to`] is in `due`.
    searched_to: Millis,
    /// The ticks in (`done`, `missed_to`] were missed: the policy decides what fires.
    missed_to: Option<Millis>,
    /// Ticks the tenant's quota refused since the last log line about it.
    refused: u64,
    refusal_logged_at: Millis,
    late_logged_at: Millis,
}

impl Cursor {
    /// A schedule seen for the first time (a deploy, or this process starting): nothing
    /// before `now` fires, except the latest tick when the policy asks for it (its
    /// idempotency key dedups it if it did fire).
    fn new(entry: Entry, now: Millis, missed: Missed) -> Cursor {
        let (done, missed_to) = match missed {
            Missed::Skip => (now, None),
            Missed::Latest => (now.saturating_sub(LOOKBACK_MS), Some(now)),
        };
        Cursor {
            entry,
            done,
            due: VecDeque::new(),
            searched_to: now,
            missed_to,
            refused: 0,
            refusal_logged_at: Millis::MIN,
            late_logged_at: Millis::MIN,
        }
    }

    /// `tick`, the oldest due, was enqueued, refused or dropped.
    fn handled(&mut self, tick: Millis) {
        self.due.pop_front();
        self.done = self.done.max(tick);
    }

    /// After the due ticks up to `now` are handled: nothing is left up to `now` (or as
    /// far as the search got).
    fn settle(&mut self, now: Millis) {
        if self.due.front().is_none_or(|&t| t > now) {
            self.done = self.done.max(self.searched_to.min(now));
        }
    }

    fn miss(&mut self, until: Millis) {
        self.missed_to = Some(self.missed_to.map_or(until, |m| m.max(until)));
    }

    /// Applies the missed policy, then finds the ticks up to `until` (and the next one).
    fn search(&mut self, missed: Missed, until: Millis, deadline: Instant) {
        if let Some(m) = self.missed_to.take()
            && m > self.done
        {
            let latest = match missed {
                Missed::Skip => None,
                Missed::Latest => self.entry.latest_in(self.done, m),
            };
            self.due.retain(|&t| t > m);
            if let Some(t) = latest {
                self.due.push_front(t);
            }
            self.done = m;
            self.searched_to = self.searched_to.max(m);
        }
        while self.searched_to < until
            && self.due.len() < MAX_TICKS_PER_PASS
            && Instant::now() < deadline
        {
            match self.entry.next_after(self.searched_to) {
                Next::At(t) => {
                    self.due.push_back(t);
                    self.searched_to = t;
                }
                Next::NoneUntil(t) => {
                    self.searched_to = t.max(self.searched_to.saturating_add(1));
                }
            }
        }
    }
}

impl Default for TenantState {
    fn default() -> Self {
        TenantState {
            functions: BTreeMap::new(),
            rotate: 0,
            budget_logged_at: Millis::MIN,
        }
    }
}

impl TenantState {
    /// Follows the tenant's schedules as listed at `at.now` and finds their ticks up to
    /// `at.horizon` (and the next one), until `deadline`. Runs on a blocking thread.
    fn plan(&mut self, tenant: &str, scheduled: Vec<Scheduled>, at: Window, deadline: Instant) {
        let Window { now, horizon } = at;
        let mut seen = HashSet::new();
        for Scheduled { function, schedule } in scheduled {
            seen.insert(function.clone());
            let tracked = self.functions.get_mut(&function);
            if let Some(t) = tracked
                && t.schedule.crons == schedule.crons
                && t.schedule.tz == schedule.tz
            {
                t.schedule = schedule;
                continue;
            }
            // New, or its expressions changed: an expression kept keeps its progress.
            let (entries, problems) = cron::entries(&schedule);
            for problem in problems {
                tracing::warn!(tenant, %function, %problem, "cron: ignoring part of a stored schedule");
            }
            let mut old: HashMap<String, Cursor> = match self.functions.remove(&function) {
                Some(t) if t.schedule.tz == schedule.tz => t
                    .cursors
                    .into_iter()
                    .map(|c| (c.entry.expr.clone(), c))
                    .collect(),
                _ => HashMap::new(),
            };
            let cursors = entries
                .into_iter()
                .map(|e| {
                    old.remove(&e.expr)
                        .unwrap_or_else(|| Cursor::new(e, now, schedule.missed))
                })
                .collect();
            self.functions
                .insert(function, Tracked { schedule, cursors });
        }
        self.functions.retain(|name, _| seen.contains(name));

        let mut active: Vec<(Missed, &mut Cursor)> = vec![];
        for (name, t) in &mut self.functions {
            if t.schedule.paused {
                continue;
            }
            for c in &mut t.cursors {
                if let Some(resumed) = t.schedule.resumed_at
                    && resumed > c.done
                {
                    c.miss(resumed);
                }
                let cutoff = now.saturating_sub(STALE_MS);
                if c.done < cutoff && c.missed_to.is_none_or(|m| m < cutoff) {
                    if now.saturating_sub(c.late_logged_at) >= REFUSAL_LOG_EVERY_MS {
                        tracing::warn!(tenant, function = %name, cron = %c.entry.expr, late_ms = now - c.done,
                            "cron: ticks more than a minute late are missed; the missed policy applies");
                        c.late_logged_at = now;
                    }
                    c.miss(cutoff);
                }
                active.push((t.schedule.missed, c));
            }
        }
        if active.is_empty() {
            return;
        }
        let start = self.rotate % active.len();
        for i in 0..active.len() {
            let at = (start + i) % active.len();
            if Instant::now() >= deadline {
                if now.saturating_sub(self.budget_logged_at) >= REFUSAL_LOG_EVERY_MS {
                    tracing::warn!(
                        tenant,
                        schedules = active.len(),
                        searched = i,
                        "cron: the tenant's search budget is used up; the rest waits for the next pass"
                    );
                    self.budget_logged_at = now;
                }
                self.rotate = at;
                return;
            }
            let (missed, c) = &mut active[at];
            c.search(*missed, horizon, deadline);
        }
    }

    /// Enqueues every tick due by `at.horizon` (those after `at.now` as runs due at their
    /// tick); see the module doc for what errors do. The
    /// enqueues run together (up to [`FIRE_IN_FLIGHT`]): the ticks of many schedules fall
    /// on the same second (on the hour, say), and one store round trip after another made
    /// the last of 25 runs 10 ms late. Their results are then taken in the ticks' order,
    /// as before; a tick after one the store could not take stays pending even if it was
    /// enqueued, and its idempotency key makes the next pass's enqueue answer that run.
    /// Once one enqueue fails so, those not started yet are not tried.
    async fn fire(&mut self, app: &App, tenant: &str, at: Window) {
        let (now, horizon) = (at.now, at.horizon);
        // (function, cursor, tick), each cursor's ticks oldest first.
        let mut due = Vec::new();
        for (function, t) in &self.functions {
            if t.schedule.paused {
                continue;
            }
            for (i, c) in t.cursors.iter().enumerate() {
                // Ticks that may be missed wait until the policy has been applied.
                if c.missed_to.is_some() {
                    continue;
                }
                let ticks = c.due.iter().take_while(|&&tick| tick <= horizon);
                due.extend(ticks.map(|&tick| (function.clone(), i, tick)));
            }
        }
        // Set by the first enqueue the store could not take: the rest do not try (they
        // stay pending), so an outage costs a pass at most one round of enqueues.
        let unavailable = AtomicBool::new(false);
        let mut enqueues = Vec::with_capacity(due.len());
        for (function, i, tick) in &due {
            let expr = &self.functions[function].cursors[*i].entry.expr;
            let unavailable = &unavailable;
            enqueues.push(async move {
                if unavailable.load(Ordering::Relaxed) {
                    return Err(StoreError::Unavailable(
                        "an earlier tick could not be enqueued".into(),
                    ));
                }
                let out = fire(app, tenant, function, expr, *tick).await;
                if out.as_ref().is_err_and(StoreError::is_retryable) {
                    unavailable.store(true, Ordering::Relaxed);
                }
                out
            });
        }
        let results: Vec<_> = futures_util::stream::iter(enqueues)
            .buffered(FIRE_IN_FLIGHT)
            .collect()
            .await;
        for ((function, i, tick), result) in due.into_iter().zip(results) {
            let t = self.functions.get_mut(&function);
            let c = &mut t.expect("a function `due` was collected from").cursors[i];
            match result {
                Ok(()) if c.refused > 0 => {
                    tracing::info!(tenant, %function, cron = %c.entry.expr, skipped = c.refused,
                        "cron ticks are accepted again");
                    c.refused = 0;
                }
                Ok(()) => {}
                Err(
                    StoreError::QuotaExceeded { message, .. }
                    | StoreError::StorageQuota(message)
                    | StoreError::Full(message),
                ) => {
                    c.refused += 1;
                    if now.saturating_sub(c.refusal_logged_at) >= REFUSAL_LOG_EVERY_MS {
                        tracing::warn!(tenant, %function, cron = %c.entry.expr, skipped = c.refused,
                            reason = %message, "cron ticks skipped: a quota or the store guard refuses them");
                        c.refused = 0;
                        c.refusal_logged_at = now;
                    }
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(tenant, error = %e, "cron: the store cannot take ticks now; they stay pending");
                    return;
                }
                Err(e) => {
                    tracing::error!(tenant, %function, cron = %c.entry.expr, tick, error = %e,
                        "cron: dropping a tick the store refused");
                }
            }
            c.handled(tick);
        }
        for t in self.functions.values_mut() {
            if t.schedule.paused {
                continue;
            }
            for c in t.cursors.iter_mut().filter(|c| c.missed_to.is_none()) {
                c.settle(horizon);
            }
        }
    }
}

async fn fire(
    app: &App,
    tenant: &str,
    function: &str,
    expr: &str,
    tick: Millis,
) -> Result<(), StoreError> {
    if let Some(reason) = app.guard.refusing() {
        return Err(StoreError::Full(reason));
    }
    let when = chrono::DateTime::from_timestamp_millis(tick)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    // Each tick starts a trace of its own, which its run's attempts continue.
    let span = tracing::debug_span!("cron.tick", tenant, function, cron = %expr, at = %when);
    let enqueued = app
        .store
        .enqueue(EnqueueRequest {
            tenant: tenant.to_owned(),
            function: function.to_owned(),
            input: serde_json::json!({ "cron": expr, "scheduled_at": when })
                .to_string()
                .into_bytes(),
            trigger: format!("cron:{expr}@{when}"),
            // Due at its tick, whenever it is enqueued: not before it (`LEAD_MS`), and a
            // tick caught up late ranks by when it was due.
            due_at: Some(tick),
            idempotency_key: Some(format!("cron:{expr}:{tick}")),
            retry: None,
            parent: None,
            priority: None,
            trace: crate::telemetry::of_span(&span),
        })
        .instrument(span)
        .await?;
    if enqueued.created {
        tracing::info!(tenant, function, cron = %expr, at = %when, "cron tick");
        app.metrics.cron_fired(tenant);
        app.wake.notify_one();
    }
    Ok(())
}

#[cfg(test)]
mod tests;
