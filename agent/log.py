"""structlog setup: JSON lines on stderr, a readable console format when stderr is a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Optional, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(level: str = "info", json_output: Optional[bool] = None, stream: Optional[TextIO] = None) -> None:
    """Configure structlog once for the process; ``json_output=None`` picks JSON unless stderr is a TTY."""
    out = stream if stream is not None else sys.stderr
    if json_output is None:
        json_output = not out.isatty()
    renderer = structlog.processors.JSONRenderer(sort_keys=True) if json_output \
        else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """A logger bound to a component name."""
    return structlog.get_logger(component=name)
