//! The job's error type and its conversion to the world's `run-error`.

use crate::bindings::RunError;
use core::fmt;
use std::time::Duration;

/// Why a job (or a step) failed, and whether the run should be tried again.
///
/// It becomes the WIT `run-error` the host reads to decide about another attempt:
///
/// | constructor | WIT case | the host |
/// |---|---|---|
/// | [`Error::retryable`] | `retryable` | retries per the function's retry policy |
/// | [`Error::fatal`] | `fatal` | never retries: the run ends as failed |
/// | [`Error::retry_after`] | `retry-after` | retries after at least the given delay |
///
/// A blanket `From<E: Display>` is impossible next to `From<T> for T`, so wrap other errors
/// with [`ResultExt`] (`.retryable()`, `.fatal()`, `.retry_after(..)`), or rely on the `From`
/// impls below, which let `?` classify common errors:
///
/// - [`serde_json::Error`], [`std::str::Utf8Error`], [`std::string::FromUtf8Error`],
///   [`std::num::ParseIntError`], [`std::num::ParseFloatError`] are **fatal**: the same data
///   fails the same way on every attempt.
/// - [`std::io::Error`], [`String`] and `&str` are **retryable**, the default of the WIT world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

/// Whether, and when, a failed run is tried again. See [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Retry per the function's retry policy.
    Retryable,
    /// Never retry: the run ends as failed.
    Fatal,
    /// Retry after at least this delay (millisecond precision).
    RetryAfter(Duration),
}

impl Error {
    /// An error after which the run is retried per the function's retry policy.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Retryable,
            message: message.into(),
        }
    }

    /// An error that ends the run as failed, without retrying.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Fatal,
            message: message.into(),
        }
    }

    /// An error after which the run is retried no sooner than `after` (e.g. a rate limit's
    /// `Retry-After`). The delay is sent to the host in whole milliseconds, rounded down.
    pub fn retry_after(after: Duration, message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::RetryAfter(after),
            message: message.into(),
        }
    }

    /// [`Error::retry_after`] with the delay in milliseconds.
    pub fn retry_after_ms(millis: u64, message: impl Into<String>) -> Self {
        Self::retry_after(Duration::from_millis(millis), message)
    }

    /// Whether and when the run is retried.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message the host stores and shows.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Shows the message only (the kind is in [`Error::kind`]).
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<Error> for RunError {
    fn from(error: Error) -> Self {
        match error.kind {
            ErrorKind::Retryable => RunError::Retryable(error.message),
            ErrorKind::Fatal => RunError::Fatal(error.message),
            ErrorKind::RetryAfter(after) => {
                let millis = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
                RunError::RetryAfter((millis, error.message))
            }
        }
    }
}

macro_rules! from_display {
    ($constructor:ident: $($ty:ty),* $(,)?) => {
        $(
            #[doc = concat!("`?` on a `", stringify!($ty), "` gives a ", stringify!($constructor), " error.")]
            impl From<$ty> for Error {
                fn from(error: $ty) -> Self {
                    Error::$constructor(error.to_string())
                }
            }
        )*
    };
}

from_display!(fatal:
    serde_json::Error,
    std::str::Utf8Error,
    std::string::FromUtf8Error,
    std::num::ParseIntError,
    std::num::ParseFloatError,
);
from_display!(retryable: std::io::Error);

/// `Err(format!(..))?` gives a retryable error.
impl From<String> for Error {
    fn from(message: String) -> Self {
        Error::retryable(message)
    }
}

/// `Err("..")?` gives a retryable error.
impl From<&str> for Error {
    fn from(message: &str) -> Self {
        Error::retryable(message)
    }
}

/// Classifies any `Result` whose error can be displayed: `parse(x).fatal()?`.
///
/// The [`Error`]'s message is the original error's `Display` output.
pub trait ResultExt<T> {
    /// Maps the error to [`Error::retryable`].
    fn retryable(self) -> Result<T, Error>;
    /// Maps the error to [`Error::fatal`].
    fn fatal(self) -> Result<T, Error>;
    /// Maps the error to [`Error::retry_after`] with delay `after`.
    fn retry_after(self, after: Duration) -> Result<T, Error>;
}

impl<T, E: fmt::Display> ResultExt<T> for Result<T, E> {
    fn retryable(self) -> Result<T, Error> {
        self.map_err(|e| Error::retryable(e.to_string()))
    }

    fn fatal(self) -> Result<T, Error> {
        self.map_err(|e| Error::fatal(e.to_string()))
    }

    fn retry_after(self, after: Duration) -> Result<T, Error> {
        self.map_err(|e| Error::retry_after(after, e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_to_run_error() {
        assert!(matches!(RunError::from(Error::fatal("x")), RunError::Fatal(m) if m == "x"));
        assert!(
            matches!(RunError::from(Error::retryable("y")), RunError::Retryable(m) if m == "y")
        );
        assert!(matches!(
            RunError::from(Error::retry_after(Duration::from_micros(2_500), "z")),
            RunError::RetryAfter((2, m)) if m == "z"
        ));
    }

    #[test]
    fn question_mark_classifies() {
        fn parse() -> Result<u32, Error> {
            Ok("nope".parse::<u32>()?)
        }
        assert_eq!(parse().unwrap_err().kind(), ErrorKind::Fatal);
        let io: Result<(), std::io::Error> = Err(std::io::Error::other("down"));
        assert_eq!(io.fatal().unwrap_err(), Error::fatal("down"));
    }
}
