//! Lifecycle transitions ([`wasq_core::lifecycle`]) as script arguments: a script reads
//! one with `read_transition` and writes it with `apply` (see scripts.rs), so the rules
//! stay in core and Lua only stores what they decided.

use wasq_core::RunStatus;
use wasq_core::lifecycle::{Change, Execution, Transition};

use crate::{Args, to_json};
use wasq_core::StoreError;

/// Arguments per transition (`read_transition` in the scripts' prelude).
pub(crate) const T_ARGS: usize = 16;

/// Appends one of a finish's alternative transitions: `'0'` when it is `None` (the same
/// as the outcome's), else `'1'` and its T_ARGS arguments. Most finishes have none, and
/// every argument costs the script an allocation.
pub(crate) fn alternative(args: Args, t: Option<&Transition>) -> Result<Args, StoreError> {
    match t {
        None => Ok(args.s("0")),
        Some(t) => self::args(args.s("1"), Some(t)),
    }
}

/// Stands for a success's transition in an end (finish.lua's `parse`), followed by the
/// six values a success has of its own: output, finish time, the execution's fuel,
/// resolution, executions and fuel counted. `read_transition` fills in the rest, which
/// every success has alike (`wasq_core::lifecycle::finish`).
pub(crate) const SUCCESS: &str = "S";
/// Arguments of a success as [`end_args`] sends it: [`SUCCESS`] and its six values.
pub(crate) const SUCCESS_ARGS: usize = 7;

/// Appends `t` as an end sends it: a success as [`SUCCESS`] and its six values (seven
/// arguments where T_ARGS are sixteen: Redis hands a script its arguments one Lua string
/// at a time, ~0.8k instructions each), anything else as [`args`].
pub(crate) fn end_args(args: Args, t: &Transition) -> Result<Args, StoreError> {
    match t {
        Transition {
            status: RunStatus::Succeeded,
            error: Change::Clear,
            output: Some(output),
            due_at: None,
            finished_at: Some(finished_at),
            give_back_attempt: false,
            execution:
                Some(Execution::Close {
                    error: None,
                    fuel_used,
                    suspended_until: None,
                }),
            resolution: Some(resolution),
            usage,
            wait: None,
            clear_cancel: false,
        } => Ok(args
            .s(SUCCESS)
            .b(output.clone())
            .n(finished_at)
            .opt_n(*fuel_used)
            .b(resolution.to_bytes())
            .n(usage.executions)
            .opt_n(usage.fuel)),
        _ => self::args(args, Some(t)),
    }
}

/// Appends `t` as T_ARGS arguments; `None` as T_ARGS empty ones (status `''`: none).
pub(crate) fn args(args: Args, t: Option<&Transition>) -> Result<Args, StoreError> {
    let Some(t) = t else {
        return Ok((0..T_ARGS).fold(args, |a, _| a.s("")));
    };
    let (errmode, error) = match &t.error {
        Change::Keep => ("k", Vec::new()),
        Change::Set(e) => ("s", to_json(e)?),
        Change::Clear => ("c", Vec::new()),
    };
    let (exec, exec_error, exec_fuel, exec_suspended) = match &t.execution {
        None => ("", Vec::new(), None, None),
        Some(Execution::Drop) => ("drop", Vec::new(), None, None),
        Some(Execution::Close {
            error,
            fuel_used,
            suspended_until,
        }) => (
            "close",
            error.as_ref().map(to_json).transpose()?.unwrap_or_default(),
            *fuel_used,
            *suspended_until,
        ),
    };
    Ok(args
        .s(t.status.as_str())
        .s(errmode)
        .b(error)
        .s(if t.output.is_some() { "1" } else { "0" })
        .b(t.output.clone().unwrap_or_default())
        .opt_n(t.due_at)
        .opt_n(t.finished_at)
        .s(if t.give_back_attempt { "1" } else { "0" })
        .s(exec)
        .b(exec_error)
        .opt_n(exec_fuel)
        .opt_n(exec_suspended)
        .b(t.resolution
            .as_ref()
            .map(|r| r.to_bytes())
            .unwrap_or_default())
        .n(t.usage.executions)
        .opt_n(t.usage.fuel)
        .s(if t.clear_cancel { "1" } else { "0" }))
}
