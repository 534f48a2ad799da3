"""The one formatter of validation problems, shared by pydantic models and the pydantic-free settings checks.

Kept apart from agent/models.py (which imports pydantic) and agent/configfile.py (which reads TOML), so both, and
every other place that reports a validation error, import it without importing each other.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Iterable, List, Mapping


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
