//! A run's step timeline: a bar per attempt (execution) and per step, on one time axis
//! from the run's creation to its end (or now), with what happened between executions
//! (a sleep, a wait, a retry's backoff) as a dashed gap.
//!
//! Drawn as SVG attributes, not inline styles, so the pages' Content-Security-Policy
//! needs no `unsafe-inline`. A step records only when it completed, so its bar starts
//! where the previous step of the same execution (or the execution) ended.

use wasq_core::clock::Millis;
use wasq_core::{Attempt, RunDetail};

use crate::format;

/// Width of the drawing in SVG units; labels take the left part.
const WIDTH: i64 = 1000;
const LABELS: i64 = 230;
const ROW: u32 = 22;
/// Bars drawn at most (the API lists at most 100 executions and 1000 steps).
const MAX_BARS: usize = 400;

#[derive(Debug)]
pub struct Timeline {
    pub height: u32,
    pub bars: Vec<Bar>,
    pub from: String,
    pub to: String,
    /// How long the axis covers.
    pub span: String,
    /// Bars left out beyond [`MAX_BARS`].
    pub more: usize,
}

#[derive(Debug)]
pub struct Bar {
    pub y: u32,
    pub text_y: u32,
    pub x: i64,
    pub width: i64,
    pub label: String,
    /// The tooltip: what, when, how long.
    pub title: String,
    /// `attempt`, `failed`, `step` or `gap`.
    pub class: &'static str,
}

impl Timeline {
    pub(crate) fn of(d: &RunDetail, now: Millis) -> Timeline {
        let start = d.run.created_at;
        let end = d.run.finished_at.unwrap_or(now).max(start + 1).max(
            d.attempts
                .iter()
                .filter_map(|a| a.finished_at)
                .max()
                .unwrap_or(0),
        );
        let x = |t: Millis| {
            LABELS + ((t - start).clamp(0, end - start) * (WIDTH - LABELS) / (end - start))
        };
        let mut bars = Vec::new();
        let mut push = |label: String, title: String, class, from: Millis, to: Millis| {
            let y = bars.len() as u32 * ROW;
            let (x0, x1) = (x(from), x(to));
            bars.push(Bar {
                y,
                text_y: y + ROW - 7,
                x: x0,
                width: (x1 - x0).max(2),
                label,
                title,
                class,
            });
        };
        let mut attempts: Vec<&Attempt> = d.attempts.iter().collect();
        attempts.sort_by_key(|a| a.started_at);
        if let Some(first) = attempts.first()
            && first.started_at > start
        {
            push(
                "queued".into(),
                format!("queued {}", format::duration(first.started_at - start)),
                "gap",
                start,
                first.started_at,
            );
        }
        for (i, a) in attempts.iter().enumerate() {
            let a_end = a.finished_at.unwrap_or(now);
            let outcome = match (&a.error, a.finished_at, a.suspended_until) {
                (Some(e), _, _) => format!("failed: {}", format::line(&e.to_string(), 200)),
                (None, None, _) => "running".into(),
                (None, Some(_), Some(_)) => "suspended".into(),
                (None, Some(_), None) => "ended".into(),
            };
            push(
                format!("execution #{} (attempt {})", i + 1, a.number),
                format!(
                    "attempt {} on {}: {} after {}",
                    a.number,
                    format::line(&a.worker, 80),
                    outcome,
                    format::duration(a_end - a.started_at)
                ),
                if a.error.is_some() {
                    "failed"
                } else {
                    "attempt"
                },
                a.started_at,
                a_end,
            );
            let mut prev = a.started_at;
            for s in d
                .steps
                .iter()
                .filter(|s| s.completed_at >= a.started_at && s.completed_at <= a_end)
            {
                push(
                    format!("  {} #{}", format::line(&s.name, 40), s.occurrence),
                    format!(
                        "step {} #{} completed {} ({} output)",
                        format::line(&s.name, 200),
                        s.occurrence,
                        format::time(s.completed_at),
                        format::bytes(s.output_bytes)
                    ),
                    "step",
                    prev,
                    s.completed_at,
                );
                prev = s.completed_at;
            }
            if let Some(next) = attempts.get(i + 1)
                && next.started_at > a_end
            {
                let what = match a.suspended_until {
                    Some(_) if d.steps.iter().any(|s| s.completed_at > a_end) => "slept or waited",
                    Some(_) => "slept",
                    None if a.error.is_some() => "until the retry",
                    None => "waited",
                };
                push(
                    what.into(),
                    format!("{what} {}", format::duration(next.started_at - a_end)),
                    "gap",
                    a_end,
                    next.started_at,
                );
            }
        }
        let more = bars.len().saturating_sub(MAX_BARS);
        bars.truncate(MAX_BARS);
        Timeline {
            height: (bars.len() as u32).max(1) * ROW,
            bars,
            from: format::time(start),
            to: format::time(end),
            span: format::duration(end - start),
            more,
        }
    }
}
