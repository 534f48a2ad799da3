"""The one formatter of validation problems, shared by pydantic models and the pydantic-free settings checks, and
the validators several models share (a day, a signed document's UTC time).

Kept apart from agent/models.py (which imports pydantic) and agent/configfile.py (which reads TOML), so both, and
every other place that reports a validation error, import it without importing each other.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Iterable, List, Mapping

# How a signed document (a root, a bundle, a freshness statement, a deny list) writes a time: UTC to the second.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def validation_problems(errors: Iterable[Mapping[str, Any]], skip_loc: int = 0, top: str = "(top level)") -> List[str]:
    """``field -> 1 -> key: message`` for every error pydantic (or a dataclass section's check) found.

    List indexes count from 1, as an operator counts the entries of a file; ``skip_loc`` drops leading location
    parts (FastAPI's ``body``), ``top`` names an error without one.
    """
    problems = []
    for err in errors:
        loc = list(err.get("loc", ()))[skip_loc:]
        where = " -> ".join(str(p + 1) if isinstance(p, int) else str(p) for p in loc) or top
        message = str(err.get("msg", "invalid"))
        if message.startswith("Value error, "):
            message = message[len("Value error, "):]
        problems.append(f"{where}: {message}")
    return problems


def iso_day(value: str) -> str:
    """``value`` when it is a day written as YYYY-MM-DD (the data files' dates); ValueError naming it otherwise."""
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a day as YYYY-MM-DD") from None
    if len(value) != 10:
        raise ValueError(f"{value!r} is not a day as YYYY-MM-DD")
    return value


def parse_time(value: str) -> dt.datetime:
    """A ``YYYY-MM-DDTHH:MM:SSZ`` text as an aware UTC time; ValueError otherwise."""
    return dt.datetime.strptime(value, TIME_FORMAT).replace(tzinfo=dt.timezone.utc)


def utc_time(value: str) -> str:
    """``value`` when it is a UTC time as YYYY-MM-DDTHH:MM:SSZ (the signed documents' times); ValueError naming it
    otherwise."""
    try:
        parse_time(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a UTC time as YYYY-MM-DDTHH:MM:SSZ") from None
    return value
