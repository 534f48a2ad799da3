"""Version specs used in policies: globs, exact versions, dpkg-style constraint lists and the words any/none.

A spec is one string or a list of strings; a list matches when any of its entries matches. One entry is

- ``any``: the package may be absent or at any version; ``none``: the package must be absent;
- a glob (``6.2.*``, ``6.1.0-2[67]-amd64``): fnmatch's rules (agent/policy/globs.py) against the version or
  release text;
- constraints joined by commas (``>= 6.1.0-26, << 6.1.0-28``), each ``OP VERSION`` with OP one of
  ``<< <= = == != >= >>``; a bare version means ``=``. Package versions compare with real dpkg or rpm ordering;
  releases (``6.2.2``, ``6.1.0-27-amd64``) with dpkg's character rules over the whole string (scheme
  ``release``).

Standard library only: the apt hook evaluates compiled specs on every apt run.
"""

from __future__ import annotations

from agent.policy.globs import glob_match
from agent.versions import compare, compare_release

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Dict, List, Optional, Sequence, Tuple, Union

    SpecValue = Union[str, Sequence[str]]
    # One parsed entry: ("any",), ("none",), ("glob", pattern) or ("range", ((op, version), ...)).
    Entry = Tuple

_OPERATORS = ("<<", "<=", ">=", ">>", "==", "!=", "=")
_GLOB_CHARS = set("*?[")


class SpecError(ValueError):
    """A spec string that cannot be parsed; the message says what is wrong in one line."""


_PARSED: Dict[str, Entry] = {}


def parse_entry(text: str) -> Entry:
    """Parse one spec entry (remembered: the evaluator asks for the same few entries again and again);
    SpecError names the problem."""
    parsed = _PARSED.get(text)
    if parsed is None:
        if len(_PARSED) > 1024:
            _PARSED.clear()
        parsed = _PARSED[text] = _parse_entry(text)
    return parsed


def _parse_entry(text: str) -> Entry:
    entry = text.strip()
    if not entry:
        raise SpecError("empty version spec")
    lowered = entry.lower()
    if lowered in ("any", "none"):
        return (lowered,)
    if "," not in entry and _GLOB_CHARS & set(entry) and not entry.startswith(tuple("<>=!")):
        return ("glob", entry)
    clauses = []
    for raw in entry.split(","):
        part = raw.strip()
        if not part:
            raise SpecError(f"empty constraint in {text!r}")
        op = next((o for o in _OPERATORS if part.startswith(o)), None)
        if op is None:
            if part[0] in "<>":
                raise SpecError(f"{part!r}: use << or <= (and >> or >=); a single < or > is ambiguous in dpkg")
            op, version = "=", part
        else:
            version = part[len(op):].strip()
        if not version:
            raise SpecError(f"{part!r}: operator {op} needs a version")
        if _GLOB_CHARS & set(version):
            raise SpecError(f"{part!r}: a constraint takes a version, not a glob")
        if " " in version:
            raise SpecError(f"{part!r}: a version has no spaces (separate constraints with commas)")
        _check_version(version)
        clauses.append(("==" if op == "=" else op, version))
    return ("range", tuple(clauses))


def _check_version(version: str) -> None:
    head = version.split(":", 1)
    if len(head) == 2 and not head[0].isdigit():
        raise SpecError(f"{version!r}: the epoch before ':' must be a number")
    if not version[0].isalnum():
        raise SpecError(f"{version!r}: a version starts with a letter or digit")


def parse_spec(value: SpecValue) -> Tuple[Entry, ...]:
    """Parse a spec (one string or a list of alternatives); SpecError on the first bad entry."""
    items = [value] if isinstance(value, str) else list(value)
    if not items:
        raise SpecError("empty list: give at least one version spec (or 'any')")
    return tuple(parse_entry(item) for item in items)


def spec_errors(value: SpecValue) -> List[str]:
    """Every problem with a spec, one message per bad entry (for policy validation)."""
    items = [value] if isinstance(value, str) else list(value)
    if not items:
        return ["empty list: give at least one version spec (or 'any')"]
    problems = []
    for item in items:
        if not isinstance(item, str):
            problems.append(f"{item!r} is not a string")
            continue
        try:
            parse_entry(item)
        except SpecError as exc:
            problems.append(str(exc))
    return problems


def package_spec_errors(value: SpecValue) -> List[str]:
    """spec_errors, and every constraint version must be one dpkg or rpm accepts (a spec on package versions
    serves both; ``1;6.8.5`` or ``1.17.3-`` would otherwise be compared by rules neither tool has)."""
    from agent.versions import dpkg_version_problem, rpm_version_problem

    problems = spec_errors(value)
    if problems:
        return problems
    for item in [value] if isinstance(value, str) else list(value):
        entry = parse_entry(item)
        if entry[0] != "range":
            continue
        for _op, version in entry[1]:
            dpkg, rpm = dpkg_version_problem(version), rpm_version_problem(version)
            if dpkg and rpm:
                problems.append(f"{version!r} is neither a dpkg version ({dpkg}) nor an rpm one ({rpm})")
    return problems


def _holds(op: str, cmp: int) -> bool:
    return {"<<": cmp < 0, "<=": cmp <= 0, "==": cmp == 0, "!=": cmp != 0, ">=": cmp >= 0, ">>": cmp > 0}[op]


def _compare(a: str, b: str, scheme: str) -> int:
    return compare_release(a, b) if scheme == "release" else compare(a, b, scheme)  # type: ignore[arg-type]


def entry_matches(entry: Entry, value: Optional[str], scheme: str = "release") -> bool:
    """Whether one parsed entry accepts ``value`` (None: the package is absent)."""
    kind = entry[0]
    if kind == "any":
        return True
    if kind == "none":
        return value is None
    if value is None:
        return False
    if kind == "glob":
        return glob_match(value, entry[1])
    try:
        return all(_holds(op, _compare(value, version, scheme)) for op, version in entry[1])
    except ValueError:
        return False


def matches(spec: SpecValue, value: Optional[str], scheme: str = "release") -> bool:
    """Whether a spec (string or list of alternatives) accepts ``value`` (None: absent)."""
    return any(entry_matches(entry, value, scheme) for entry in parse_spec(spec))


def describe(spec: SpecValue) -> str:
    """A spec as operators read it: alternatives joined by ' or '."""
    items = [spec] if isinstance(spec, str) else list(spec)
    return " or ".join(items)
