"""Durable steps, sleeps, events and child runs: the host's ``wasq:task/step`` interface.

A run may take several attempts (after an error, a crash, or a long sleep). Every attempt
calls your task from the top. A step that completed in an earlier attempt is **not** run
again: ``step`` returns its stored output. Code outside steps re-runs on every attempt, so it
must be deterministic: begin the same steps in the same order each time (steps are matched
by name and by how many times that name was begun before in the attempt). Put side effects
and non-deterministic values (time, randomness, HTTP) inside steps.

A body that was running when its worker died may run again (at least once): make its side
effects idempotent with :func:`idempotency_key` (``wasq.http.post(..., idempotent=True)``).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping, Optional, TypeVar, Union

from componentize_py_types import Err
from wit_world.imports import context as _ctx
from wit_world.imports import step as _wit

from .errors import ChildFailed, Fatal, millis_of

T = TypeVar("T")
Duration = Union[float, int, timedelta]

# Per attempt (each attempt is a fresh instance; `task` also resets them):
_begun: dict[str, int] = {}  # steps begun so far, by name, counted like the host does
_keys: list[str] = []  # idempotency keys of the step bodies running (nested steps stack)


def _reset() -> None:
    _begun.clear()
    _keys.clear()


def _encode(value: Any, what: str) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":")).encode()
    except (TypeError, ValueError) as e:
        raise Fatal(f"{what}: not JSON-serialisable: {e}") from e


def _decode(data: bytes, what: str) -> Any:
    try:
        return json.loads(data) if data.strip() else None
    except ValueError as e:
        raise Fatal(f"{what}: not JSON: {e}") from e


def step(name: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Runs ``fn(*args, **kwargs)`` as the durable step ``name`` and returns its result,
    or returns the result stored by an earlier attempt without calling ``fn``.

    The result must be JSON-serialisable; you always get it back as JSON would (tuples
    become lists, dict keys strings), on the first run as on replays, so both take the
    same path. If ``fn`` raises, nothing is stored and the exception propagates.

        greeting = wasq.step("greet", lambda: f"Hello, {name}!")

        def charge() -> dict:
            return wasq.http.post(url, json=order, idempotent=True).json()
        receipt = wasq.step("charge", charge)
    """
    occurrence = _begun.get(name, 0)
    _begun[name] = occurrence + 1
    stored = _wit.begin(name)
    if stored is not None:
        return _decode(stored, f"step {name!r}: stored output")  # type: ignore[no-any-return]
    _keys.append(f"wasq-{_ctx.info().run_id}-{name}-{occurrence}")
    try:
        value = fn(*args, **kwargs)
    finally:
        _keys.pop()
    data = _encode(value, f"step {name!r}: output")
    _wit.complete(name, data)
    return json.loads(data)  # type: ignore[no-any-return]


def idempotency_key() -> Optional[str]:
    """Inside a step body: ``wasq-RUN-STEP-N``, the same every time this step of this run
    runs, for APIs that deduplicate by a key. ``None`` outside a step body."""
    return _keys[-1] if _keys else None


def sleep(name: str, duration: Duration) -> None:
    """Durable sleep of ``duration`` (seconds or a ``timedelta``), counted from the first
    time the run got here: a retry or a restart neither restarts nor skips it. Long sleeps
    end the attempt and free the worker; the run is replayed when due."""
    _wit.sleep(name, millis_of(duration))


def sleep_until(name: str, when: Union[datetime, float, int]) -> None:
    """Durable sleep until ``when``: a ``datetime`` (naive means UTC) or Unix seconds."""
    if isinstance(when, datetime):
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        when = when.timestamp()
    _wit.sleep_until(name, max(0, round(float(when) * 1000)))


def wait_for_event(
    name: str,
    event: str,
    if_: Optional[Mapping[str, Any]] = None,
    timeout: Optional[Duration] = None,
) -> Any:
    """Suspends the run until event ``event`` is sent (after the run started waiting) and
    returns its data. ``if_`` filters by dotted paths into the data, e.g.
    ``{"user_id": 42, "order.status": "paid"}``. Returns ``None`` when ``timeout`` (seconds
    or a ``timedelta``; ``None`` = forever) passes first."""
    filt = json.dumps(dict(if_)) if if_ is not None else None
    millis = 0 if timeout is None else max(1, millis_of(timeout))
    data = _wit.wait_for_event(name, event, filt, millis)
    return None if data is None else _decode(data, f"event {event!r} data")


def send_event(name: str, event: str, data: Any = None) -> None:
    """Sends event ``event`` with JSON ``data``, once however often the run is replayed."""
    _wit.send_event(name, event, _encode(data, f"event {event!r} data"))


def invoke(name: str, function: str, input: Any = None) -> str:
    """Starts ``function`` as a child run (once per run) and returns its run id."""
    return _wit.invoke(name, function, _encode(input, f"input of {function}"))


def call(name: str, function: str, input: Any = None) -> Any:
    """Runs ``function`` as a child run and returns its output; suspends meanwhile without
    holding a worker. Raises :class:`wasq.ChildFailed` if the child failed."""
    try:
        out = _wit.call(name, function, _encode(input, f"input of {function}"))
    except Err as e:
        raise ChildFailed(function, str(e.value)) from None
    return _decode(out, f"output of {function}")


def join(name: str, run_id: str) -> Any:
    """Waits for run ``run_id`` (from :func:`invoke`) to end and returns its output, like
    :func:`call`: invoke N children, then join each."""
    try:
        out = _wit.join(name, run_id)
    except Err as e:
        raise ChildFailed(run_id, str(e.value)) from None
    return _decode(out, f"output of {run_id}")
