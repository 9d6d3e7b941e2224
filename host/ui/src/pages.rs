//! The pages: one askama template each (`templates/`), and the plain view of what the API
//! answered that it renders. Builders take wasq-core's types and do every bounding and
//! formatting, so templates only lay out strings.

use askama::Template;
use wasq_core::clock::Millis;
use wasq_core::{Function, LogLine, Run, RunDetail, RunStatus};

use crate::format;
pub use crate::timeline::{Bar, Timeline};

/// Bounds on what a page shows of untrusted text (the API answers the rest).
const CELL: usize = 120;
const BLOCK: usize = 64 << 10;
const LOG_LINE: usize = 4 << 10;

/// What every signed-in page shows around its content.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The tenant signed in, or `operator`.
    pub who: String,
    pub operator: bool,
    /// The form token every POST must carry.
    pub csrf: String,
    /// The nav entry to mark.
    pub nav: &'static str,
    /// A one-line notice (an action's result).
    pub notice: Option<String>,
}

/// The page's [`Layout`], for `base.html` (the login and error pages may have none).
pub trait Chrome {
    fn chrome(&self) -> Option<&Layout>;
}

macro_rules! chrome {
    ($($page:ty),*) => {$(
        impl Chrome for $page {
            fn chrome(&self) -> Option<&Layout> {
                Some(&self.layout)
            }
        }
    )*};
}

chrome!(
    Runs,
    RunPage,
    Functions,
    FunctionPage,
    Schedules,
    Queues,
    Tenants,
    Audit
);

impl Chrome for ErrorPage {
    fn chrome(&self) -> Option<&Layout> {
        self.layout.as_ref()
    }
}

impl Layout {
    pub fn notice(mut self, notice: Option<&str>) -> Layout {
        self.notice = notice.map(|n| format::line(n, 300));
        self
    }
}

#[derive(Debug, Template)]
#[template(path = "login.html")]
pub struct Login {
    pub error: Option<String>,
}

#[derive(Debug, Template)]
#[template(path = "error.html")]
pub struct ErrorPage {
    pub layout: Option<Layout>,
    pub status: u16,
    pub message: String,
}

impl ErrorPage {
    pub fn new(layout: Option<Layout>, status: u16, message: &str) -> ErrorPage {
        ErrorPage {
            layout,
            status,
            message: format::line(message, 1000),
        }
    }
}

/// A `<select>` choice.
#[derive(Debug)]
pub struct Choice {
    pub value: String,
    pub selected: bool,
}

fn choices(values: impl IntoIterator<Item = String>, selected: &str) -> Vec<Choice> {
    values
        .into_iter()
        .map(|value| Choice {
            selected: value == selected,
            value,
        })
        .collect()
}

/// The runs list's filters, as the form shows them.
#[derive(Debug, Default, Clone)]
pub struct RunFilter {
    pub function: String,
    pub status: String,
    /// `datetime-local` values (UTC).
    pub since: String,
    pub until: String,
    /// An id or a prefix of one.
    pub q: String,
}

#[derive(Debug)]
pub struct RunRow {
    pub id: String,
    pub short: String,
    pub function: String,
    pub status: &'static str,
    pub attempt: u32,
    pub trigger: String,
    pub created: String,
    pub result: String,
}

impl RunRow {
    pub fn of(r: &Run) -> RunRow {
        let result = match (&r.error, &r.output) {
            (Some(e), _) => e.to_string(),
            (None, Some(out)) => String::from_utf8_lossy(out).into_owned(),
            (None, None) => r
                .progress
                .as_ref()
                .map(|p| format!("{}% {}", p.percent, p.message.as_deref().unwrap_or("")))
                .unwrap_or_default(),
        };
        RunRow {
            id: format::line(&r.id, 40),
            short: format::short_id(&r.id),
            function: format::line(&r.function, CELL),
            status: r.status.as_str(),
            attempt: r.attempt,
            trigger: format::line(&r.trigger, CELL),
            created: format::time(r.created_at),
            result: format::line(&result, CELL),
        }
    }
}

#[derive(Debug, Template)]
#[template(path = "runs.html")]
pub struct Runs {
    pub layout: Layout,
    pub filter: RunFilter,
    pub functions: Vec<Choice>,
    pub statuses: Vec<Choice>,
    pub rows: Vec<RunRow>,
    /// The query string of the next (older) page.
    pub older: Option<String>,
    /// The first page follows new runs; later pages stay still.
    pub live: bool,
    /// This page's own address, which its live part re-reads.
    pub here: String,
    pub error: Option<String>,
}

impl Runs {
    pub fn new(layout: Layout, filter: RunFilter, functions: Vec<String>, here: String) -> Runs {
        let statuses = [
            "queued",
            "running",
            "sleeping",
            "waiting",
            "succeeded",
            "failed",
            "cancelled",
            "skipped",
        ];
        Runs {
            functions: choices(functions, &filter.function),
            statuses: choices(statuses.map(String::from), &filter.status),
            layout,
            filter,
            rows: Vec::new(),
            older: None,
            live: false,
            here,
            error: None,
        }
    }
}

#[derive(Debug)]
pub struct AttemptRow {
    pub number: u32,
    pub worker: String,
    pub started: String,
    pub took: String,
    pub outcome: String,
    pub failed: bool,
    pub fuel: String,
}

#[derive(Debug)]
pub struct StepRow {
    pub name: String,
    pub occurrence: u32,
    pub attempt: u32,
    pub completed: String,
    pub output: String,
}

#[derive(Debug)]
pub struct LogRow {
    pub at: String,
    pub attempt: u32,
    pub level: String,
    pub source: String,
    pub message: String,
}

#[derive(Debug, Template)]
#[template(path = "run.html")]
pub struct RunPage {
    pub layout: Layout,
    pub id: String,
    pub function: String,
    pub status: &'static str,
    pub attempt: u32,
    pub max_attempts: u32,
    pub trigger: String,
    pub queue: String,
    pub priority: i32,
    pub created: String,
    pub due: Option<String>,
    pub finished: Option<String>,
    pub took: Option<String>,
    pub waiting_for: Option<String>,
    pub progress: Option<(u8, String)>,
    pub fuel: String,
    pub stored: String,
    pub input: String,
    pub output: Option<String>,
    pub error: Option<String>,
    pub attempts: Vec<AttemptRow>,
    pub attempts_total: u64,
    pub timeline: Timeline,
    pub steps: Vec<StepRow>,
    pub steps_total: u64,
    pub logs: Vec<LogRow>,
    pub parent: Option<String>,
    pub children: Vec<RunRow>,
    pub can_retry: bool,
    pub can_cancel: bool,
    pub live: bool,
}

impl RunPage {
    pub fn new(
        layout: Layout,
        d: &RunDetail,
        logs: &[LogLine],
        children: &[Run],
        now: Millis,
    ) -> RunPage {
        let r = &d.run;
        let mut attempts: Vec<AttemptRow> = d
            .attempts
            .iter()
            .map(|a| AttemptRow {
                number: a.number,
                worker: format::line(&a.worker, 80),
                started: format::time(a.started_at),
                took: format::duration(a.finished_at.unwrap_or(now) - a.started_at),
                outcome: match (&a.error, a.finished_at, a.suspended_until) {
                    (Some(e), _, _) => format::block(&e.to_string(), BLOCK),
                    (None, None, _) => "running".into(),
                    (None, Some(_), Some(until)) => {
                        format!("suspended until {}", format::time(until))
                    }
                    (None, Some(_), None) => "ended".into(),
                },
                failed: a.error.is_some(),
                fuel: a.fuel_used.map_or_else(String::new, |f| f.to_string()),
            })
            .collect();
        attempts.sort_by_key(|a| std::cmp::Reverse(a.number));
        let fuel: u64 = d.attempts.iter().filter_map(|a| a.fuel_used).sum();
        let queued = r.status == RunStatus::Queued || r.status == RunStatus::Sleeping;
        RunPage {
            layout,
            id: format::line(&r.id, 40),
            function: format::line(&r.function, CELL),
            status: r.status.as_str(),
            attempt: r.attempt,
            max_attempts: r.settings.retry.max_attempts,
            trigger: format::line(&r.trigger, CELL),
            queue: format::line(&r.settings.queue, CELL),
            priority: r.priority,
            created: format::time(r.created_at),
            due: (queued && r.due_at > now).then(|| {
                format!(
                    "{} (in {})",
                    format::time(r.due_at),
                    format::duration(r.due_at - now)
                )
            }),
            finished: r.finished_at.map(format::time),
            took: r.finished_at.map(|f| format::duration(f - r.created_at)),
            waiting_for: r.wait.as_ref().map(|w| {
                let on = match &w.on {
                    wasq_core::WaitOn::Event { name, .. } => format!("event {name}"),
                    wasq_core::WaitOn::Run { id } => format!("run {id}"),
                };
                format::line(&format!("{on} (step {})", w.step), 300)
            }),
            progress: r.progress.as_ref().map(|p| {
                (
                    p.percent.min(100),
                    format::line(p.message.as_deref().unwrap_or(""), 300),
                )
            }),
            fuel: fuel.to_string(),
            stored: format::bytes(r.stored_bytes + r.log_bytes),
            input: format::json(&r.input, BLOCK),
            output: r.output.as_deref().map(|o| format::json(o, BLOCK)),
            error: r
                .error
                .as_ref()
                .map(|e| format::block(&e.to_string(), BLOCK)),
            attempts,
            attempts_total: d.attempts_total,
            timeline: Timeline::of(d, now),
            steps: d
                .steps
                .iter()
                .map(|s| StepRow {
                    name: format::line(&s.name, CELL),
                    occurrence: s.occurrence,
                    attempt: s.attempt,
                    completed: format::time(s.completed_at),
                    output: format::bytes(s.output_bytes),
                })
                .collect(),
            steps_total: d.steps_total,
            logs: logs
                .iter()
                .map(|l| LogRow {
                    at: format::time(l.at),
                    attempt: l.attempt,
                    level: format!("{:?}", l.level).to_lowercase(),
                    source: format!("{:?}", l.source).to_lowercase(),
                    message: format::block(&l.message, LOG_LINE),
                })
                .collect(),
            parent: r.parent.as_deref().map(|p| format::line(p, 40)),
            children: children.iter().map(RunRow::of).collect(),
            can_retry: matches!(r.status, RunStatus::Failed | RunStatus::Cancelled),
            can_cancel: !r.status.is_terminal(),
            live: !r.status.is_terminal(),
        }
    }
}

/// Success rate and latency of a function's runs that ended in the last hour.
#[derive(Debug, Default)]
pub struct Health {
    pub ended: usize,
    pub succeeded: usize,
    pub success: String,
    pub p50: String,
    pub p95: String,
    /// Whether the sample hit the listing's bound (the figures cover the newest runs).
    pub sampled: bool,
}

impl Health {
    pub fn of(runs: &[Run], sampled: bool) -> Health {
        let ended: Vec<&Run> = runs.iter().filter(|r| r.status.is_terminal()).collect();
        let succeeded = ended
            .iter()
            .filter(|r| r.status == RunStatus::Succeeded)
            .count();
        let mut took: Vec<Millis> = ended
            .iter()
            .filter_map(|r| r.finished_at.map(|f| f - r.created_at))
            .collect();
        took.sort_unstable();
        let pct = |p: usize| {
            took.get((took.len() * p / 100).min(took.len().saturating_sub(1)))
                .map_or_else(|| "–".to_owned(), |&t| format::duration(t))
        };
        Health {
            ended: ended.len(),
            succeeded,
            success: if ended.is_empty() {
                "–".into()
            } else {
                format!("{:.1}%", succeeded as f64 * 100.0 / ended.len() as f64)
            },
            p50: pct(50),
            p95: pct(95),
            sampled,
        }
    }
}

#[derive(Debug)]
pub struct FunctionRow {
    pub name: String,
    pub digest: String,
    pub size: String,
    pub deployed: String,
    pub queue: String,
    pub triggers: String,
    pub health: Health,
}

impl FunctionRow {
    pub fn of(f: &Function, health: Health) -> FunctionRow {
        let mut triggers: Vec<String> = f.events.iter().map(|e| format!("event:{e}")).collect();
        if let Some(s) = &f.schedule {
            triggers.extend(s.crons.iter().map(|c| format!("cron:{c}")));
        }
        FunctionRow {
            name: format::line(&f.name, CELL),
            digest: format::line(f.digest.get(..12).unwrap_or(&f.digest), 20),
            size: format::bytes(f.size_bytes),
            deployed: format::time(f.updated_at),
            queue: format::line(&f.settings.queue, CELL),
            triggers: format::line(&triggers.join(", "), 400),
            health,
        }
    }
}

#[derive(Debug, Template)]
#[template(path = "functions.html")]
pub struct Functions {
    pub layout: Layout,
    pub rows: Vec<FunctionRow>,
}

#[derive(Debug, Template)]
#[template(path = "function.html")]
pub struct FunctionPage {
    pub layout: Layout,
    pub row: FunctionRow,
    pub digest: String,
    pub first_deployed: String,
    pub settings: String,
    pub schedule: Option<String>,
}

impl FunctionPage {
    pub fn new(layout: Layout, f: &Function, health: Health) -> FunctionPage {
        FunctionPage {
            layout,
            digest: format::line(&f.digest, 80),
            first_deployed: format::time(f.created_at),
            settings: format::json(&serde_json::to_vec(&f.settings).unwrap_or_default(), BLOCK),
            schedule: f
                .schedule
                .as_ref()
                .map(|s| format::json(&serde_json::to_vec(s).unwrap_or_default(), BLOCK)),
            row: FunctionRow::of(f, health),
        }
    }
}

#[derive(Debug)]
pub struct ScheduleRow {
    pub function: String,
    pub cron: String,
    pub tz: String,
    pub missed: String,
    pub paused: bool,
    pub next: Vec<String>,
}

impl ScheduleRow {
    /// From one entry of `GET /v1/schedules`.
    pub fn of(v: &serde_json::Value) -> ScheduleRow {
        let s = |k: &str| format::line(v[k].as_str().unwrap_or(""), CELL);
        ScheduleRow {
            function: s("function"),
            cron: s("cron"),
            tz: s("tz"),
            missed: format::line(&v["missed"].to_string().replace('"', ""), 40),
            paused: v["paused"].as_bool().unwrap_or(false),
            next: v["next"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|t| t.as_i64())
                        .map(format::time)
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

#[derive(Debug, Template)]
#[template(path = "schedules.html")]
pub struct Schedules {
    pub layout: Layout,
    pub rows: Vec<ScheduleRow>,
}

#[derive(Debug)]
pub struct Count {
    pub name: String,
    pub status: String,
    pub count: u64,
}

/// Runs that ended in one slice of the last hour, as chart bars.
#[derive(Debug)]
pub struct Slice {
    pub x: u32,
    pub ok_y: u32,
    pub ok_h: u32,
    pub bad_y: u32,
    pub bad_h: u32,
    pub title: String,
}

#[derive(Debug, Template)]
#[template(path = "queues.html")]
pub struct Queues {
    pub layout: Layout,
    /// (queue, waiting, running)
    pub queues: Vec<(String, u64, u64)>,
    pub counts: Vec<Count>,
    pub oldest: Option<String>,
    pub workers: Vec<WorkerRow>,
    pub chart: Vec<Slice>,
    pub chart_note: String,
}

/// Chart height in SVG units.
const CHART_H: u32 = 120;
const SLICES: i64 = 12;

impl Queues {
    /// The throughput and failure chart: runs that ended in each 5-minute slice of the
    /// hour before `now`, from `recent` (runs created in that hour; `sampled` when the
    /// listing's bound cut it).
    pub fn chart(recent: &[Run], now: Millis, sampled: bool) -> (Vec<Slice>, String) {
        let slice_ms = 3_600_000 / SLICES;
        let start = now - 3_600_000;
        let mut ok = [0u32; SLICES as usize];
        let mut bad = [0u32; SLICES as usize];
        for r in recent {
            let Some(f) = r.finished_at.filter(|f| *f >= start && *f <= now) else {
                continue;
            };
            let i = (((f - start) / slice_ms) as usize).min(SLICES as usize - 1);
            match r.status {
                RunStatus::Succeeded => ok[i] += 1,
                RunStatus::Failed => bad[i] += 1,
                _ => {}
            }
        }
        let max = (0..SLICES as usize)
            .map(|i| ok[i] + bad[i])
            .max()
            .unwrap_or(0)
            .max(1);
        let slices = (0..SLICES as usize)
            .map(|i| {
                let ok_h = ok[i] * CHART_H / max;
                let bad_h = bad[i] * CHART_H / max;
                Slice {
                    x: i as u32 * 50 + 5,
                    ok_y: CHART_H - ok_h,
                    ok_h,
                    bad_y: CHART_H - ok_h - bad_h,
                    bad_h,
                    title: format!(
                        "{} to {}: {} succeeded, {} failed",
                        format::time(start + i as i64 * slice_ms),
                        format::time(start + (i as i64 + 1) * slice_ms),
                        ok[i],
                        bad[i]
                    ),
                }
            })
            .collect();
        let total: u32 = ok.iter().chain(bad.iter()).sum();
        let note = format!(
            "{total} runs ended in the last hour ({} failed; the tallest bar is {max}){}",
            bad.iter().sum::<u32>(),
            if sampled {
                ", counting the newest 1,000 runs created in it"
            } else {
                ""
            }
        );
        (slices, note)
    }

    pub fn oldest(oldest_queued_at: Option<Millis>, now: Millis) -> Option<String> {
        oldest_queued_at.map(|t| format!("{} ago ({})", format::duration(now - t), format::time(t)))
    }

    pub fn name(s: &str) -> String {
        format::line(s, CELL)
    }
}

/// A worker as its last heartbeat described it.
#[derive(Debug)]
pub struct WorkerRow {
    pub id: String,
    pub queues: String,
    pub busy: u32,
    pub slots: u32,
    pub up: String,
    pub seen: String,
}

impl WorkerRow {
    pub fn of(w: &wasq_core::WorkerBeat, now: Millis) -> WorkerRow {
        WorkerRow {
            id: format::line(&w.id, CELL),
            queues: if w.queues.is_empty() {
                "all".into()
            } else {
                format::line(&w.queues.join(", "), 400)
            },
            busy: w.busy,
            slots: w.slots,
            up: format::duration(now - w.started_at),
            seen: format!("{} ago", format::duration(now - w.seen_at)),
        }
    }
}

#[derive(Debug)]
pub struct TenantRow {
    pub name: String,
    pub created: String,
    pub quotas: Vec<(String, String)>,
    pub fuel: String,
    pub attempts: String,
    pub stored: String,
}

impl TenantRow {
    /// From one entry of `GET /v1/tenants`.
    pub fn of(v: &serde_json::Value) -> TenantRow {
        let num = |v: &serde_json::Value| v.as_u64().map_or_else(|| "–".into(), |n| n.to_string());
        TenantRow {
            name: format::line(v["name"].as_str().unwrap_or(""), CELL),
            created: v["created_at"]
                .as_i64()
                .map(format::time)
                .unwrap_or_default(),
            quotas: v["quotas"]
                .as_object()
                .map(|q| {
                    q.iter()
                        .map(|(k, v)| (format::line(k, 60), format::line(&v.to_string(), 60)))
                        .collect()
                })
                .unwrap_or_default(),
            fuel: num(&v["usage"]["fuel"]),
            attempts: num(&v["usage"]["attempts"]),
            stored: v["usage"]["stored_bytes"]
                .as_u64()
                .map(format::bytes)
                .unwrap_or_default(),
        }
    }
}

#[derive(Debug, Template)]
#[template(path = "tenants.html")]
pub struct Tenants {
    pub layout: Layout,
    pub rows: Vec<TenantRow>,
}

#[derive(Debug)]
pub struct AuditRow {
    pub at: String,
    pub tenant: String,
    pub actor: String,
    pub action: String,
    pub target: String,
}

impl AuditRow {
    pub fn of(e: &wasq_core::AuditEntry) -> AuditRow {
        AuditRow {
            at: format::time(e.at),
            tenant: format::line(&e.tenant, CELL),
            actor: format::line(&e.actor, CELL),
            action: format::line(&e.action, CELL),
            target: format::line(&e.target, 300),
        }
    }
}

#[derive(Debug, Template)]
#[template(path = "audit.html")]
pub struct Audit {
    pub layout: Layout,
    pub rows: Vec<AuditRow>,
}
