"""A runner that replays recorded command output, keyed on argv, and refuses any argv nobody recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from agent.errors import CommandNotFound, CommandTimeout
from agent.host import CommandResult


class UnrecordedCommand(AssertionError):
    """The code under test ran a command that the fixture has no recording for."""


class FakeRunner:
    """Replays recordings: ``{"argv": [...], "returncode": 0, "stdout": "...", "stderr": ""}``.

    ``{root}`` inside a recorded argv stands for the fixture root, so recordings do not depend on the checkout
    path. A recording may say ``"not_found": true`` (program missing) or ``"timeout": true``.
    """

    def __init__(self, recordings: Sequence[dict] = (), root: str = "/") -> None:
        self.calls: List[Tuple[str, ...]] = []
        self._by_argv: Dict[Tuple[str, ...], dict] = {}
        for rec in recordings:
            argv = tuple(part.replace("{root}", root) for part in rec["argv"])
            self._by_argv[argv] = rec

    @classmethod
    def from_file(cls, path: Path, root: str) -> "FakeRunner":
        return cls(json.loads(path.read_text()) if path.exists() else [], root)

    def add(self, argv: Sequence[str], stdout: str = "", returncode: int = 0, stderr: str = "",
            not_found: bool = False, timeout: bool = False) -> None:
        self._by_argv[tuple(argv)] = {"argv": list(argv), "stdout": stdout, "returncode": returncode,
                                      "stderr": stderr, "not_found": not_found, "timeout": timeout}

    def __call__(self, argv: Sequence[str], timeout_seconds: float) -> CommandResult:
        key = tuple(argv)
        self.calls.append(key)
        rec: Optional[dict] = self._by_argv.get(key)
        if rec is None:
            raise UnrecordedCommand(f"no recording for argv {list(argv)!r}")
        if rec.get("not_found"):
            raise CommandNotFound(argv, "not installed")
        if rec.get("timeout"):
            raise CommandTimeout(argv, timeout_seconds)
        return CommandResult(key, rec.get("returncode", 0), rec.get("stdout", ""), rec.get("stderr", ""))
