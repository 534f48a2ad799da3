"""structlog setup: JSON lines on stderr, a readable console format when stderr is a terminal.

structlog (with asyncio and, where installed, rich) is imported on the first log line that passes the level, not
on import: a command that logs nothing (``gpuguard snapshot`` at the default level) never loads it. ``configure``
only records the choice until then; ``get_logger`` hands out a small proxy that checks the level first.

Each line goes out with its newline in one write (:class:`LineWriter`): the daemon and its job children share one
stderr (a file, a pipe, journald's socket), and structlog's PrintLogger (``print``) writes the text and the newline
apart when the stream is unbuffered (``PYTHONUNBUFFERED``, ``-u``) or the line is 8 KiB or longer, so another
process's line could land between them and make two lines one that does not parse.
"""

from __future__ import annotations

import _thread
import sys
from typing import Any, Mapping, MutableMapping, Optional, TextIO

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}

# (level number, json_output, stream) from the last configure(); None: never configured (structlog's defaults).
_config: Optional[tuple] = None
_applied: Optional[tuple] = None


def configure(level: str = "info", json_output: Optional[bool] = None, stream: Optional[TextIO] = None) -> None:
    """Configure logging for the process; ``json_output=None`` picks JSON unless the stream is a TTY.

    Applied to structlog at once when structlog is already loaded, else when the first line is logged.
    """
    global _config
    _config = (_LEVELS.get(level, 20), json_output, stream if stream is not None else sys.stderr)
    if "structlog" in sys.modules:
        _apply()


def _apply() -> None:
    """Hand the recorded configuration to structlog (imports it)."""
    global _applied
    import structlog

    if _config is None or _applied is _config:
        return
    level, json_output, out = _config
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
            _escape_strings,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=lambda *args: LineWriter(out),
        cache_logger_on_first_use=False,
    )
    _applied = _config


class LineWriter:
    """structlog's logger: each rendered line and its newline in one write to the stream, lines of this process's
    threads one after another."""

    __slots__ = ("_file",)

    def __init__(self, file: TextIO) -> None:
        self._file = file

    def msg(self, message: str) -> None:
        with _write_lock:
            self._file.write(message + "\n")
            self._file.flush()

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


_write_lock = _thread.allocate_lock()  # _thread, not threading: a snapshot starts no thread (issue #45)


def _escape_strings(logger: Any, method: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
    """A structlog processor: every string value escaped (agent/printable.py), so no log line carries a terminal escape.

    The console format writes strings as they are; a probe's stderr or a package name from outside must not drive
    the terminal of whoever reads the log.
    """
    from agent.printable import printable

    # A traceback (format_exc_info's "exception") keeps its lines; any other value is one line.
    return {key: printable(value, keep_newlines=key == "exception") if isinstance(value, str) else value
            for key, value in event.items()}


class Logger:
    """A logger bound to a component name; structlog is loaded by the first line the level lets through."""

    __slots__ = ("_component",)

    def __init__(self, component: str) -> None:
        self._component = component

    def _emit(self, method: str, number: int, event: str, kw: Any) -> None:
        if _config is not None and number < _config[0]:
            return
        import structlog

        if _applied is not _config:
            _apply()
        getattr(structlog.get_logger(component=self._component), method)(event, **kw)

    def debug(self, event: str, **kw: Any) -> None:
        self._emit("debug", 10, event, kw)

    def info(self, event: str, **kw: Any) -> None:
        self._emit("info", 20, event, kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._emit("warning", 30, event, kw)

    def error(self, event: str, **kw: Any) -> None:
        self._emit("error", 40, event, kw)


def get_logger(name: str) -> Logger:
    """A logger bound to a component name."""
    return Logger(name)
