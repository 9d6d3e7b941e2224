"""Write wasq tasks in Python: the guest SDK of the wasq job runner.

A task is a function from the run's JSON input to a JSON-serialisable output:

    import wasq

    @wasq.task
    def main(input: dict) -> dict:
        greeting = wasq.step("greet", lambda: f"Hello, {input['name']}!")
        return {"greeting": greeting}

Build it into a WebAssembly component with componentize-py (it imports ``app`` at build
time, so module-level code runs then, not per run; never call wasq functions at import):

    componentize-py -d wit -w wasq:task/task@0.1.0 componentize app -p . -o hello.wasm

See ``wasq.durable`` for what re-runs on a retry, ``wasq.errors`` for failing on purpose,
``wasq.http`` for outbound HTTP and ``wasq.log`` for the run's log.
"""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

import wit_world
from componentize_py_types import Err
from wit_world.imports import context as _ctx
from wit_world.imports import progress as _progress
from wit_world.imports.wasq_task_types import (
    RunError,
    RunError_Fatal,
    RunError_Retryable,
    RunError_RetryAfter,
)

from . import durable, http, log
from .durable import (
    call,
    idempotency_key,
    invoke,
    join,
    send_event,
    sleep,
    sleep_until,
    step,
    wait_for_event,
)
from .errors import ChildFailed, Error, Fatal, RetryAfter, Retryable

__all__ = [
    "task", "step", "idempotency_key", "sleep", "sleep_until", "wait_for_event",
    "send_event", "invoke", "call", "join", "progress", "context", "time_left", "RunInfo",
    "log", "http", "Error", "Retryable", "Fatal", "RetryAfter", "ChildFailed",
]

F = TypeVar("F", bound=Callable[[Any], Any])


@dataclass(frozen=True)
class RunInfo:
    """Facts about the run this attempt belongs to."""

    run_id: str
    function: str
    tenant: str
    attempt: int  # 1 for the first attempt
    max_attempts: int
    trigger: str  # "api", "event:<name>", "cron:<schedule>", "child:<run-id>"


def context() -> RunInfo:
    """The run's id, function, attempt number and trigger (only inside a run)."""
    i = _ctx.info()
    return RunInfo(i.run_id, i.function, i.tenant, i.attempt, i.max_attempts, i.trigger)


def time_left() -> float:
    """Seconds this attempt has left before its time limit (the function's timeout) stops
    it; 0 once passed. Checkpoint in a step before it: the next attempt goes on from there."""
    return _ctx.time_left() / 1000.0


def progress(percent: float, message: Optional[str] = None) -> None:
    """Reports progress (0-100, clamped), shown by ``wasq run --wait`` and the API."""
    _progress.report(max(0, min(100, int(percent))), message)


def task(fn: F) -> F:
    """Makes ``fn(input) -> output`` the task's entry point.

    The input is the run's JSON input parsed (``None`` when empty); invalid JSON fails the
    run fatally without calling ``fn``. The return value becomes the run's output as JSON
    (``bytes`` are passed through as they are). Exceptions decide about another attempt:
    see ``wasq.errors``.

    componentize-py looks for a class ``WitWorld`` in the app module: this decorator
    defines it there, so decorate the entry point in ``app.py`` itself.
    """

    class WitWorld(wit_world.WitWorld):
        def run(self, input: bytes) -> bytes:
            return _run(fn, input)

    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if module is None:
        raise TypeError("@wasq.task: cannot find the module defining the task")
    setattr(module, "WitWorld", WitWorld)
    log.install()
    return fn


def _run(fn: Callable[[Any], Any], input: bytes) -> bytes:
    durable._reset()  # a fresh instance per attempt already; this keeps it so if reused
    try:
        value = json.loads(input) if input.strip() else None
    except ValueError as e:
        raise Err(RunError_Fatal(f"invalid input: {e}")) from None
    try:
        output = fn(value)
        if isinstance(output, (bytes, bytearray)):
            return bytes(output)
        return durable._encode(output, "output")
    except Error as e:
        raise Err(_run_error(e)) from None
    except Exception as e:
        # Unexpected: retryable (it may be transient), with the whole traceback logged.
        # The first frame is this function: the user's frames are what helps.
        tb = e.__traceback__.tb_next if e.__traceback__ else None
        log.error("".join(traceback.format_exception(type(e), e, tb)).rstrip())
        last = traceback.format_exception_only(e)[-1].strip()
        raise Err(RunError_Retryable(last)) from None


def _run_error(e: Error) -> RunError:
    message = str(e) or type(e).__name__
    if e.kind == "fatal":
        return RunError_Fatal(message)
    if e.kind == "retry-after":
        return RunError_RetryAfter((e.retry_after_ms, message))
    return RunError_Retryable(message)
