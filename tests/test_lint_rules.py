"""Lint rules ruff cannot express: collectors read files only through the Host seam; the agent opens files only
through the helpers that cannot block, or at a reviewed place.

The ``subprocess`` half of the rule is ruff's banned-api table (pyproject.toml,
``[tool.ruff.lint.flake8-tidy-imports.banned-api]``). Raw file reads are checked here because ruff's banned-api
does not see a bare builtin ``open(...)`` and cannot tell ``Path.read_text`` from ``host.read_text``. Collectors
read through the Host (``host.read_text``, ``host.exists``, ``host.list_dir`` ...) so tests can point them at a
fixture tree; a raw read would read the test machine instead.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List

import pytest

REPO = Path(__file__).resolve().parents[1]
COLLECTORS = sorted((REPO / "agent/collectors").glob("*.py"))

# Calls of these names (bare or as module attributes) read files without the Host.
_RAW_FUNCTIONS = {"open", "io.open", "os.open", "os.fdopen", "os.read", "codecs.open"}
# Methods of pathlib.Path (or of any file-like object) that read or open: allowed only on the Host itself.
_RAW_METHODS = {"read_text", "read_bytes", "open"}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _is_host(node: ast.expr) -> bool:
    """``host``, ``self.host``, ``rt.host``...: the receiver is the Host seam."""
    return _dotted(node).split(".")[-1] == "host"


def raw_reads(source: str, filename: str = "<source>") -> List[str]:
    """``line: call`` for every raw file read in source."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name in _RAW_FUNCTIONS:
            found.append(f"{node.lineno}: {name}()")
        elif isinstance(node.func, ast.Attribute) and node.func.attr in _RAW_METHODS and not _is_host(node.func.value):
            found.append(f"{node.lineno}: {name or '<expr>.' + node.func.attr}()")
    return found


def test_the_rule_sees_raw_reads() -> None:
    """The rule finds open(), io.open, os.open and Path reads, and lets reads through the host pass."""
    source = ("import io, os\nfrom pathlib import Path\n"
              "open('/etc/os-release')\nPath('/x').read_text()\nhost.path('/y').read_bytes()\nio.open('/z')\n"
              "os.open('/w', 0)\nwith Path('/v').open() as f: pass\n"
              "host.read_text('/ok')\nself.host.read_text('/ok')\n")
    assert [line.split(":")[0] for line in raw_reads(source)] == ["3", "4", "5", "6", "7", "8"]


def test_there_are_collectors_to_check() -> None:
    """The collector glob finds the collectors, so the check below cannot pass on none."""
    assert len(COLLECTORS) > 5


@pytest.mark.parametrize("path", COLLECTORS, ids=lambda p: p.name)
def test_collectors_read_files_only_through_the_host(path: Path) -> None:
    """Each collector reads files only through the Host seam."""
    found = raw_reads(path.read_text(), str(path))
    assert not found, (f"{path.relative_to(REPO)} reads files without the Host seam: {'; '.join(found)}. "
                       "Collectors read through host.read_text / host.read_first_line / host.list_dir "
                       "(agent/host.py) so tests can point them at a fixture root.")


# Calls that open a file by name, anywhere under agent/ (issue 39): a FIFO put in place of a state file must never
# hold the hook or the daemon, so files are opened through agent/hostfacts/paths.py (open_regular,
# read_regular_file) and agent/files.py (read_bytes_bounded, read_json_file, open_regular_file, open_append_regular,
# write_atomically), or through the Host (host.read_text, host.read_bytes, built on open_regular).
_OPENERS = {"open", "io.open", "os.open", "posix.open", "codecs.open"}
_OPENING_METHODS = {"open", "read_text", "read_bytes"}

# (module, call) -> why it may open a file itself. Every entry must still match a call (a stale one fails).
REVIEWED_OPENS = {
    ("agent/hostfacts/paths.py", "posix.open()"): "the helpers themselves (O_NONBLOCK, fstat S_ISREG)",
    ("agent/files.py", "os.open()"): "the helpers themselves: O_EXCL|O_NOFOLLOW temporaries, open_append_regular",
    ("agent/host.py", ".read_text()"): "the Host itself: read_first_line calls its own read_text",
    ("agent/guard/hotpath/state.py", "os.open()"): "the hook's append: O_NONBLOCK and fstat S_ISREG, stdlib posix "
                                                   "only (agent.files would cost the hook's start-up)",
    ("agent/guard/locks.py", "os.open()"): "fcntl lock probe: O_RDWR|O_NONBLOCK, fstat S_ISREG",
    ("agent/guard/rollback/health_gate.py", "os.open()"): "the state directory itself, O_DIRECTORY, for its flock",
    ("agent/status/facts.py", "os.open()"): "_read_tail: O_NONBLOCK and fstat S_ISREG",
    ("agent/status/facts.py", "open()"): "/proc/<pid>/cmdline",
    ("agent/status/reboot.py", "open()"): "/proc/uptime",
    ("agent/daemon_jobs/children.py", "open()"): "/proc/<pid>/status",
    ("agent/daemon_jobs/children.py", "os.open()"): "/dev/null for the child's stdin and stdout",
    ("agent/health/reaper.py", "open()"): "/proc/<pid>/stat and /proc/<pid>/task/*/children",
    ("agent/health/sandbox.py", ".read_text()"): "cgroup files under /sys/fs/cgroup and /proc/<pid>/stat, statm",
    ("agent/health/sandbox.py", "os.open()"): "O_DIRECTORY|O_NOFOLLOW opens of the probe's own directories",
    ("agent/health/probe.py", "open()"): "the standalone probe script (imports nothing from the agent), in its own "
                                         "temp dir",
    ("agent/health/checklock.py", "open()"): "the check lock, 'a+' (O_RDWR: a FIFO does not block its open on "
                                             "Linux); the health helpers' module",
    ("agent/bundle/install.py", "open()"): "bundle files written into the installer's own TemporaryDirectory",
    ("agent/guard/apt/deb_rebuild.py", "open()"): "the .deb being rebuilt (.partial files it created itself) and "
                                                  "regular files lstat'ed just before, from dpkg's file list",
    ("agent/guard/apt/deb_rebuild.py", "tarfile.open()"): "tar streams over file objects (fileobj=), no path",
    ("agent/hub/server.py", ".open()"): "store.open(): the hub's database store, not a file",
    ("agent/hub/tokens.py", "os.open()"): "the tokens directory fd (fsync) and the tokens lock, O_RDWR (does not "
                                          "block on a FIFO)",
    ("agent/report/outbox.py", "os.open()"): "creating the outbox database 0600 before SQLite opens it",
}


def file_opens(source: str, filename: str = "<source>") -> List[str]:
    """``line: call`` for every call that opens a file by name in source (reads through the Host aside)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name in _OPENERS:
            found.append(f"{node.lineno}: {name}()")
        elif (isinstance(node.func, ast.Attribute) and node.func.attr in _OPENING_METHODS
              and not _is_host(node.func.value)):
            found.append(f"{node.lineno}: {name or '<expr>.' + node.func.attr}()")
    return found


def unreviewed_opens(sources: Dict[str, str]) -> List[str]:
    """``module:line: call`` for every file open not in REVIEWED_OPENS (``sources``: module path -> its text)."""
    found = []
    for module, source in sorted(sources.items()):
        for hit in file_opens(source, module):
            line, call = hit.split(": ", 1)
            if (module, _generic(call)) not in REVIEWED_OPENS:
                found.append(f"{module}:{line}: {call}")
    return found


def _generic(call: str) -> str:
    """The allowlist's name of a call: functions by name (``os.open()``, ``tarfile.open()``), methods by the method
    alone (``Path(...).read_text()`` and ``self.path.read_text()`` are both ``.read_text()``)."""
    name = call[:-2]
    if name in _OPENERS or name == "tarfile.open":
        return call
    return "." + name.rpartition(".")[2] + "()"


AGENT_MODULES = sorted((REPO / "agent").rglob("*.py"))


def _agent_sources() -> Dict[str, str]:
    return {str(path.relative_to(REPO)): path.read_text() for path in AGENT_MODULES}


def test_the_open_rule_fires_on_a_synthetic_module() -> None:
    """An unreviewed open(), os.open, Path.open, read_text and read_bytes in a module under agent/ are all found,
    and a read through the host is not."""
    source = ("import os\nfrom pathlib import Path\n"
              "open('/var/lib/gpuguard/x.json')\nos.open('/var/lib/gpuguard/y', 0)\nPath('/z').open()\n"
              "Path('/w').read_text()\nself.path.read_bytes()\nhost.read_text('/ok')\n")
    found = unreviewed_opens({"agent/status/example.py": source})
    assert [hit.split(":")[1] for hit in found] == ["3", "4", "5", "6", "7"]
    # The same call in a module reviewed for it passes: the allowlist is per module.
    assert unreviewed_opens({"agent/status/reboot.py": "open('/proc/uptime')\n"}) == []


def test_every_reviewed_open_is_still_there() -> None:
    """Each allowlist entry matches a call in its module, so the list shrinks when a place is fixed."""
    seen = set()
    for module, source in _agent_sources().items():
        for hit in file_opens(source, module):
            seen.add((module, _generic(hit.split(": ", 1)[1])))
    assert sorted(set(REVIEWED_OPENS) - seen) == []


def test_the_agent_opens_files_only_through_the_helpers_or_at_reviewed_places() -> None:
    """No module under agent/ opens a file by name outside REVIEWED_OPENS (state files: agent/files.py helpers)."""
    found = unreviewed_opens(_agent_sources())
    assert not found, ("files opened without the helpers that cannot block on a FIFO: " + "; ".join(found)
                       + ". Use agent/files.py (read_bytes_bounded, read_json_file, open_regular_file, "
                       "open_append_regular, write_atomically) or add a reviewed place with its reason to "
                       "REVIEWED_OPENS in tests/test_lint_rules.py")
