"""Strict JSON text: json's grammar without NaN or Infinity, bounded nesting, and no ``json`` import on success.

``unique_keys=True`` also refuses an object that names a key twice (json's default keeps the last one, so two
readers could see two different values): what an untrusted process prints is read that way (health/parse.py).

Every JSON state file and the compiled policy go through :func:`parse_json_text`, the apt hook included, so it
imports nothing but the error tree: ``import json`` pulls in ``re`` and ``enum`` (about as long as starting
Python), and ``os`` would cost the hook another millisecond and a half.
"""

from __future__ import annotations

from agent.errors import InputFileError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any

MAX_NESTING_DEPTH = 64


def nesting_depth(value: "Any") -> int:
    """How deeply lists and objects nest in a decoded value (iterative: a deep value cannot exhaust the stack)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _refuse_constant(name: str) -> "Any":
    raise ValueError(f"non-finite number {name} is not allowed")


def _finite_float(text: str) -> float:
    import math

    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"non-finite number {text} is not allowed")
    return value


def _unique_pairs(pairs: "Any") -> "Any":
    """An object's pairs as a dict; ValueError when a key appears twice."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}"[:200])
        out[key] = value
    return out


class _StrictScan:
    """The settings ``_json.make_scanner`` reads from a decoder: json's defaults, but NaN and Infinity refused."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = staticmethod(_finite_float)
    parse_int = int
    parse_constant = staticmethod(_refuse_constant)


class _UniqueKeysScan(_StrictScan):
    """The strict settings, and an object that names a key twice refused."""

    object_pairs_hook = staticmethod(_unique_pairs)  # type: ignore[assignment]  # the base's None means "dict"


_JSON_SPACE = " \t\n\r"


def _loads(text: str, unique_keys: bool = False) -> "Any":
    """``json.loads`` with the strict settings, through the C scanner json.decoder itself uses when it can.

    ``import json`` pulls in ``re`` and ``enum`` (about as long as starting Python), and the apt hook reads its
    compiled policy through here on every apt run. The json module is imported only to describe an error, or
    where the C scanner is missing.
    """
    try:
        from _json import make_scanner
    except ImportError:  # pragma: no cover - CPython always has it
        pass
    else:
        start = len(text) - len(text.lstrip(_JSON_SPACE))
        scan = make_scanner((_UniqueKeysScan if unique_keys else _StrictScan)())  # type: ignore[arg-type]  # typeshed asks for a JSONDecoder
        try:
            value, end = scan(text, start)
        except Exception:  # noqa: BLE001 - json.loads below parses it again and raises its own worded error
            # The C scanner reports a syntax error through json.decoder's JSONDecodeError, which it looks up in
            # sys.modules only: without json imported it fails with a SystemError instead (seen in the chroot).
            pass
        else:
            if not text[end:].strip(_JSON_SPACE):
                return value
    import json

    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                      object_pairs_hook=_unique_pairs if unique_keys else None)


def parse_json_text(path: str, text: str, max_depth: int = MAX_NESTING_DEPTH, unique_keys: bool = False) -> "Any":
    """Strict JSON: no NaN/Infinity (nor a float that overflows to one), at most ``max_depth`` levels deep;
    ``unique_keys``: no object naming a key twice."""
    try:
        data = _loads(text, unique_keys)
    except RecursionError:
        raise InputFileError(path, f"not valid JSON (nested deeper than {max_depth} levels)") from None
    except ValueError as exc:
        raise InputFileError(path, f"not valid JSON ({exc})") from None
    if nesting_depth(data) > max_depth:
        raise InputFileError(path, f"not valid JSON (nested deeper than {max_depth} levels)")
    return data
