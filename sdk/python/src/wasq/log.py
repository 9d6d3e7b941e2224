"""The run's log: ``wasq.log.info("charged %s", customer)``, or the standard ``logging``.

``@wasq.task`` puts a :class:`Handler` on the root logger (at level INFO) unless you
configured logging yourself, so ``logging.getLogger(__name__).info(...)`` reaches the
run's log too, with its level. ``print`` also works: stdout lines are stored as info,
stderr lines as warn, but without levels.
"""

from __future__ import annotations

import logging
from typing import Any

from wit_world.imports import log as _wit
from wit_world.imports.log import Level

__all__ = ["trace", "debug", "info", "warn", "warning", "error", "write", "Handler"]


def _text(message: Any, args: tuple[Any, ...]) -> str:
    # %-style arguments like `logging`, so switching between the two is painless.
    text = str(message)
    return text % args if args else text


def write(level: Level, message: str) -> None:
    """Writes one line at ``level`` (a ``wit_world.imports.log.Level``)."""
    _wit.write(level, message)


def trace(message: Any, *args: Any) -> None:
    _wit.write(Level.TRACE, _text(message, args))


def debug(message: Any, *args: Any) -> None:
    _wit.write(Level.DEBUG, _text(message, args))


def info(message: Any, *args: Any) -> None:
    _wit.write(Level.INFO, _text(message, args))


def warn(message: Any, *args: Any) -> None:
    _wit.write(Level.WARN, _text(message, args))


warning = warn


def error(message: Any, *args: Any) -> None:
    _wit.write(Level.ERROR, _text(message, args))


def _level(levelno: int) -> Level:
    if levelno >= logging.ERROR:
        return Level.ERROR
    if levelno >= logging.WARNING:
        return Level.WARN
    if levelno >= logging.INFO:
        return Level.INFO
    if levelno >= logging.DEBUG:
        return Level.DEBUG
    return Level.TRACE


class Handler(logging.Handler):
    """A ``logging`` handler writing records to the run's log. Records of named loggers
    are prefixed with the logger's name; tracebacks (``logger.exception``) are included."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            if record.name != "root":
                text = f"{record.name}: {text}"
            _wit.write(_level(record.levelno), text)
        except Exception:  # a logging call must never fail the task
            self.handleError(record)


def install() -> None:
    """Routes the root logger to the run's log, unless logging was configured already.

    Runs at import (build) time: it only touches Python objects, never the host.
    """
    root = logging.getLogger()
    if root.handlers:
        return
    root.addHandler(Handler())
    if root.level == logging.WARNING:  # Python's default would drop info lines
        root.setLevel(logging.INFO)
