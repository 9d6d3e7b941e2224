"""Why a task failed, and whether wasq should try the run again.

Raise one of these from a task (or from a step body) to choose what happens:

- ``Retryable(msg)``: retried per the function's retry policy (``max_attempts``, ``backoff``).
- ``Fatal(msg)``: never retried; the run ends as failed.
- ``RetryAfter(seconds, msg)``: retried no sooner than ``seconds`` (e.g. a 429's Retry-After).

Any other uncaught exception is retryable: its message is the traceback's last line
(``ZeroDivisionError: division by zero``) and the whole traceback goes to the run's log.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal, Union

Kind = Literal["retryable", "fatal", "retry-after"]


def seconds_of(value: Union[float, int, timedelta]) -> float:
    """Seconds in a number or a timedelta (durations are accepted as either everywhere)."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def millis_of(value: Union[float, int, timedelta]) -> int:
    return max(0, round(seconds_of(value) * 1000))


class Error(Exception):
    """Base of the errors that say how a run continues; ``kind`` decides it.

    Subclasses elsewhere (``wasq.http.HTTPError``, ``wasq.ChildFailed``) pick their kind
    per instance, so test ``err.kind`` rather than the class when it matters.
    """

    kind: Kind = "retryable"
    #: For ``kind == "retry-after"``: the least delay before the next attempt.
    retry_after_ms: int = 0

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class Retryable(Error):
    """Try the run again per the function's retry policy."""

    kind: Kind = "retryable"


class Fatal(Error):
    """End the run as failed, without another attempt."""

    kind: Kind = "fatal"


class RetryAfter(Error):
    """Try the run again no sooner than ``after`` (seconds or a ``timedelta``)."""

    kind: Kind = "retry-after"

    def __init__(self, after: Union[float, int, timedelta], message: str = "") -> None:
        super().__init__(message)
        self.retry_after_ms = millis_of(after)


class ChildFailed(Fatal):
    """A child run (``call``/``join``) failed or was cancelled. Fatal: the child's result is
    durable, so another attempt would see the same failure. Catch it to recover."""

    def __init__(self, target: str, reason: str) -> None:
        super().__init__(f"{target} failed: {reason}")
        self.target = target
        self.reason = reason
