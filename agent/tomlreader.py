"""The one choice of TOML parser: ``tomllib`` (Python 3.11+) or the vendored ``tomli`` before it.

Every TOML file gpuguard reads (agent.toml, hub.toml, the policy files, the AMD matrix, containerd's config, dnf5's
versionlock.toml) is parsed by the module :func:`toml_module` returns; :func:`toml_worded` says pydantic's
strict-type errors the TOML way, and MAX_TOML_BYTES caps what an operator's TOML file may be. Not on the hot path
(tomli is not in the standard library), and imported only when a TOML text is first read: most snapshots read none.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

# Operator-written TOML (policy files, the AMD matrix): a policy naming 100,000 packages is about 2 MB; past this
# a file is damaged or hostile and is refused unread.
MAX_TOML_BYTES = 16 << 20


def toml_module() -> Any:
    """``tomllib``, or ``tomli`` on Python < 3.11."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python < 3.11 hosts (the vendored tomli)
        import tomli as tomllib
    return tomllib


_TOML_TYPES = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
               dict: "a table"}
_WANTED = {"bool_type": "true or false", "int_type": "a whole number", "string_type": "a string in quotes"}


def toml_worded(error: Mapping[str, Any]) -> Mapping[str, Any]:
    """pydantic's strict-type messages said the TOML way: ``'yes' is a string: write true or false (no quotes)``."""
    wanted = _WANTED.get(str(error.get("type")))
    value = error.get("input")
    if wanted is None or isinstance(value, (dict, list)):
        return error
    shown = ("true" if value else "false") if isinstance(value, bool) else repr(value)
    if isinstance(value, float) and error.get("type") == "int_type":
        return {**error, "msg": f"{shown} is not a whole number"}
    given = _TOML_TYPES.get(type(value), "a value of another type")
    hint = " (no quotes)" if isinstance(value, str) else ""
    return {**error, "msg": f"{shown} is {given}: write {wanted}{hint}"}
