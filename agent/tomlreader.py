"""The one choice of TOML parser: ``tomllib`` (Python 3.11+) or the vendored ``tomli`` before it.

Every TOML file gpuguard reads (agent.toml, hub.toml, the policy files, the AMD matrix, containerd's config, dnf5's
versionlock.toml) is parsed by the module :func:`toml_module` returns. Not on the hot path (tomli is not in the
standard library), and imported only when a TOML text is first read: most snapshots read none.
"""

from __future__ import annotations

import sys
from typing import Any


def toml_module() -> Any:
    """``tomllib``, or ``tomli`` on Python < 3.11."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python < 3.11 hosts (the vendored tomli)
        import tomli as tomllib
    return tomllib
