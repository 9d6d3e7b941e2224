//! Structured log lines, stored with the run and shown by the CLI, API and dashboard.
//!
//! Use the macros [`trace!`](crate::trace), [`debug!`](crate::debug), [`info!`](crate::info),
//! [`warn!`](crate::warn) and [`error!`](crate::error), which take `format!` arguments:
//!
//! ```no_run
//! # let (email, id) = ("ada@example.com", 42);
//! wasq_guest::info!("sending welcome email to {email} for user {id}");
//! ```
//!
//! Log lines written inside a step body are written again only if that body runs again.
//! Anything printed to stdout/stderr (e.g. `println!`, a panic message) is captured by the
//! host separately from these lines.

use crate::bindings::wasq::task::log as wit;

/// How important a log line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal progress.
    Info,
    /// Something unexpected that the job handled.
    Warn,
    /// A failure.
    Error,
}

impl From<Level> for wit::Level {
    fn from(level: Level) -> Self {
        match level {
            Level::Trace => wit::Level::Trace,
            Level::Debug => wit::Level::Debug,
            Level::Info => wit::Level::Info,
            Level::Warn => wit::Level::Warn,
            Level::Error => wit::Level::Error,
        }
    }
}

/// Writes one log line at `level`. The macros call this.
pub fn write(level: Level, message: &str) {
    wit::write(level.into(), message);
}

/// Writes a log line at level [`Level::Trace`]; takes `format!` arguments.
#[macro_export]
macro_rules! trace {
    ($($arg:tt)+) => {
        $crate::__private::log($crate::log::Level::Trace, ::core::format_args!($($arg)+))
    };
}

/// Writes a log line at level [`Level::Debug`]; takes `format!` arguments.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => {
        $crate::__private::log($crate::log::Level::Debug, ::core::format_args!($($arg)+))
    };
}

/// Writes a log line at level [`Level::Info`]; takes `format!` arguments.
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => {
        $crate::__private::log($crate::log::Level::Info, ::core::format_args!($($arg)+))
    };
}

/// Writes a log line at level [`Level::Warn`]; takes `format!` arguments.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => {
        $crate::__private::log($crate::log::Level::Warn, ::core::format_args!($($arg)+))
    };
}

/// Writes a log line at level [`Level::Error`]; takes `format!` arguments.
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => {
        $crate::__private::log($crate::log::Level::Error, ::core::format_args!($($arg)+))
    };
}
