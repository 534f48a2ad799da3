"""A /usr/bin/python3 worker with python3-rpm (the venv has no rpm bindings): one JSON line in, one JSON line out.

The ordering test (rpm.labelCompare) and the version-validity test (rpm.spec) each send their own worker code.
Without python3-rpm the test skips locally and fails in CI (tests/needs.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from tests import needs

SYSTEM_PYTHON = "/usr/bin/python3"


class RpmWorker:
    """One long-lived worker process; ``ask`` sends a request and returns the decoded answer."""

    def __init__(self, code: str, quiet: bool) -> None:
        self.proc = subprocess.Popen([SYSTEM_PYTHON, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL if quiet else None, text=True)

    def ask(self, request: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


def start_rpm_worker(code: str, what: str, probe: str = "import rpm", quiet: bool = False) -> RpmWorker:
    """A worker running ``code``, once ``probe`` shows python3-rpm works under /usr/bin/python3."""
    checked = subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, check=False) \
        if os.access(SYSTEM_PYTHON, os.X_OK) else None
    if checked is None or checked.returncode != 0:
        needs.unavailable(what, "python3-rpm is missing for /usr/bin/python3 (scripts/test-packages.txt)")
    return RpmWorker(code, quiet)
