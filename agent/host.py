"""The seam between gpuguard and the machine: every file read, command and GPU library goes through a Host.

A Host has a root path (``/`` on a real host, a fixture tree in tests), a runner for commands, a loader for GPU
management libraries (amdsmi, pynvml) and a clock. Tests build a Host over a fixture tree with a fake runner and
fake library modules; nothing else in the agent touches ``open``, ``subprocess`` or ``import amdsmi`` directly.
"""

from __future__ import annotations

import datetime as dt
import os
import posixpath
import time
from types import ModuleType
from typing import TYPE_CHECKING, Callable, Iterator, List, Mapping, Optional, Protocol, Sequence

from agent.errors import CommandError, CommandNotFound, CommandTimeout, HostReadError
from agent.frozen import Frozen, field, frozen_record
from agent.gpu_libraries import import_gpu_library, no_gpu_library
from agent.hostfacts.paths import open_regular

if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_TIMEOUT_SECONDS = 10.0
# Commands get a fixed, predictable environment: C locale so output parsers see one language.
_COMMAND_ENV = {"LC_ALL": "C", "LANG": "C", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
# Passed on when set: where Slurm's commands find slurm.conf on a site that keeps it elsewhere (scontrol from a
# Prolog or HealthCheckProgram, docs/integrations.md).
_PASSED_ENV = ("SLURM_CONF",)


@frozen_record
class CommandResult(Frozen):
    """What one finished command printed and returned."""

    argv: tuple
    returncode: int
    stdout: str
    stderr: str = ""
    duration_seconds: float = 0.0

    def check(self) -> "CommandResult":
        """Return self, or raise CommandError when the command exited non-zero."""
        if self.returncode != 0:
            first = (self.stderr.strip() or self.stdout.strip()).splitlines()[:1]
            raise CommandError(self.argv, f"exit {self.returncode}: {first[0] if first else 'no output'}",
                               self.returncode)
        return self


class Runner(Protocol):
    """Runs one command given as an argv list; never through a shell."""

    def __call__(self, argv: Sequence[str], timeout_seconds: float) -> CommandResult: ...


class SubprocessRunner:
    """Runs commands for real with a timeout, in the C locale."""

    def __init__(self, extra_env: Optional[Mapping[str, str]] = None) -> None:
        self._env = dict(_COMMAND_ENV)
        self._env.update({name: os.environ[name] for name in _PASSED_ENV if name in os.environ})
        if extra_env:
            self._env.update(extra_env)

    def __call__(self, argv: Sequence[str], timeout_seconds: float) -> CommandResult:
        import subprocess  # here, not at the top: a snapshot whose tool versions are cached runs no command

        started = time.monotonic()
        try:
            proc = subprocess.run(list(argv), capture_output=True, text=True, errors="replace",
                                  timeout=timeout_seconds, env=self._env, stdin=subprocess.DEVNULL, check=False)
        except FileNotFoundError as exc:
            raise CommandNotFound(argv, "not installed") from exc
        except PermissionError as exc:
            raise CommandError(argv, f"not executable: {exc.strerror}") from exc
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeout(argv, timeout_seconds) from exc
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


ModuleLoader = Callable[[str], ModuleType]


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@frozen_record
class Host(Frozen):
    """A view of one machine: files under ``root``, commands through ``runner``, libraries through ``load_module``."""

    # A string: the snapshot asks for paths under it over a hundred times, and pathlib (with urllib.parse and
    # ipaddress) was a tenth of its start-up (issue #45); ``path`` gives a Path to whoever wants one.
    root: str = "/"
    runner: Runner = field(default_factory=SubprocessRunner)
    load_module: ModuleLoader = import_gpu_library
    clock: Callable[[], dt.datetime] = _utc_now
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def for_root(cls, root: str = "/") -> "Host":
        """The real host at ``/``, or a foreign root (chroot, fixture) whose GPU libraries are not loaded."""
        path = os.path.realpath(root)
        if path == "/":
            return cls(root=path, env=dict(os.environ))
        return cls(root=path, load_module=no_gpu_library, env={})

    @property
    def is_live(self) -> bool:
        """True when this Host is the machine we run on, not a fixture or chroot."""
        return os.fspath(self.root) == "/"

    def file(self, host_path: str) -> str:
        """Where an absolute host path lives under this Host's root, as a string (the collectors' hot path)."""
        return os.path.join(os.fspath(self.root), host_path.lstrip("/"))

    def path(self, host_path: str) -> "Path":
        """Where an absolute host path lives under this Host's root, as a Path (pathlib imported only here)."""
        from pathlib import Path

        return Path(self.file(host_path))

    def read_text(self, host_path: str, max_chars: Optional[int] = None) -> Optional[str]:
        """The file's text (its first ``max_chars`` characters when given), or None when it does not exist;
        HostReadError when it exists but cannot be read."""
        fd = self._open_regular(host_path)
        if fd is None:
            return None
        with os.fdopen(fd, encoding="utf-8", errors="replace") as stream:
            try:
                return stream.read() if max_chars is None else stream.read(max_chars)
            except OSError as exc:
                raise HostReadError(host_path, exc.strerror or str(exc)) from exc

    def read_bytes(self, host_path: str) -> Optional[bytes]:
        """The file's bytes, or None when it does not exist; HostReadError when it exists but cannot be read."""
        fd = self._open_regular(host_path)
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as stream:
            try:
                return stream.read()
            except OSError as exc:
                raise HostReadError(host_path, exc.strerror or str(exc)) from exc

    def _open_regular(self, host_path: str) -> Optional[int]:
        """A descriptor of the regular file at ``host_path``, opened so that it never blocks
        (agent.hostfacts.paths.open_regular); None when there is none or a directory is there; HostReadError for a
        FIFO, socket or device in its place, or a file that cannot be opened. /proc and /sys files are regular."""
        path = self.file(host_path)
        try:
            return open_regular(path)[0]
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if os.path.isdir(path):  # as before: a directory where a file was looked for reads as nothing
                return None
            raise HostReadError(host_path, exc.strerror or str(exc)) from exc

    def read_first_line(self, host_path: str) -> Optional[str]:
        """The first line of a (sysfs-style) one-value file, stripped; None when missing or empty."""
        text = self.read_text(host_path)
        if text is None:
            return None
        line = text.strip().splitlines()[0].strip() if text.strip() else ""
        return line or None

    def exists(self, host_path: str) -> bool:
        return os.path.lexists(self.file(host_path))

    def is_dir(self, host_path: str) -> bool:
        return os.path.isdir(self.file(host_path))

    def list_dir(self, host_path: str) -> List[str]:
        """Sorted entry names of a directory; empty when it does not exist."""
        try:
            return sorted(os.listdir(self.file(host_path)))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise HostReadError(host_path, exc.strerror or str(exc)) from exc

    def read_link(self, host_path: str) -> Optional[str]:
        """The raw target of a symlink, or None when the path is not a link."""
        try:
            return os.readlink(self.file(host_path))
        except (FileNotFoundError, OSError):
            return None

    def resolve(self, host_path: str) -> str:
        """Follow symlinks inside this Host's root and return the final host path (absolute, no root prefix)."""
        current = _normalise(host_path)
        for _ in range(40):
            parts = current.split("/")[1:] if current != "/" else []
            changed = False
            for i in range(1, len(parts) + 1):
                prefix = "/" + "/".join(parts[:i])
                target = self.read_link(prefix)
                if target is None:
                    continue
                if not target.startswith("/"):
                    target = posixpath.join(posixpath.dirname(prefix), target)
                current = _normalise("/".join([target, *parts[i:]]))
                changed = True
                break
            if not changed:
                return current
        return current

    def which(self, program: str, search: Sequence[str] = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin",
                                                           "/usr/bin", "/sbin", "/bin")) -> Optional[str]:
        """The host path of an executable program under root, or None."""
        for directory in search:
            candidate = f"{directory}/{program}"
            p = self.file(candidate)
            if os.path.isfile(p) and os.access(p, os.X_OK):
                return candidate
        return None

    def run(self, argv: Sequence[str], timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> CommandResult:
        """Run a command (argv list) through the injected runner."""
        return self.runner(list(argv), timeout_seconds)

    def hostname(self) -> str:
        return (self.read_first_line("/proc/sys/kernel/hostname") or self.read_first_line("/etc/hostname")
                or "unknown")

    def walk_files(self, host_path: str) -> Iterator[str]:
        """Host paths of regular files below a directory (sorted, depth first)."""
        for name in self.list_dir(host_path):
            child = f"{host_path.rstrip('/')}/{name}"
            p = self.file(child)
            if os.path.isdir(p) and not os.path.islink(p):
                yield from self.walk_files(child)
            elif os.path.isfile(p):
                yield child


def _normalise(path: str) -> str:
    """An absolute host path with ``.``, ``..`` and repeated slashes folded, never above ``/``."""
    out: List[str] = []
    for part in path.split("/"):
        if part == "..":
            if out:
                out.pop()
        elif part and part != ".":
            out.append(part)
    return "/" + "/".join(out)
