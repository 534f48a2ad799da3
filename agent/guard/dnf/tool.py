"""dnf and rpm as commands, for rollback and versionlock: installed set, plan, one-transaction rollback, downloads.

Commands run through the Host seam (argv lists, timeouts). For a Host whose root is not ``/`` dnf runs on this
machine with ``--installroot=ROOT`` and rpm with ``--root ROOT`` (paths given to them are real paths, not paths
inside the root). A rollback is ONE dnf transaction: a ``dnf shell`` script of ``install FILE|NEVRA`` (dnf
downgrades when the named build is older than the installed one) and ``remove NEVRA`` lines. ``dnf shell`` logs
a line it cannot resolve and carries on with the rest, so the script is first resolved with ``--assumeno`` and
only run when every line resolved and the plan moves exactly the packages asked for. dnf5 has no ``dnf shell``:
there the same lines become one ``dnf5 do --action=install FILE|NEVRA ... --action=remove NEVRA ...`` command
(dnf5 >= 5.2; an item it cannot resolve fails the whole transaction), planned with ``--assumeno`` and checked the
same way. Waiting for the lock uses rpm's own lock (an fcntl record lock on ``.rpm.lock`` in the database
directory) and dnf4's pid file.

Install-only packages (kernels) sit side by side in rpm: they are keyed ``name@version`` so a rollback removes the
kernel that slipped in instead of "downgrading" another one.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from agent.guard.dnf.request import DEFAULT_INSTALLONLY
from agent.guard.locks import record_lock_is_free, wait_for_locks
from agent.guard.rollback.backend import InstalledPackage, PlannedStep
from agent.host import CommandResult, Host
from agent.hostfacts.paths import read_regular_file
from agent.hostfacts.rpmdb import parse_rpm_rows, rpm_query_argv
from agent.policy.globs import any_glob
from agent.statepaths import StatePaths

RPM_LOCK_FILES = ("/var/lib/rpm/.rpm.lock", "/usr/lib/sysimage/rpm/.rpm.lock")
DNF_LOCK_FILES = ("/var/lib/dnf/rpmdb_lock.pid",)  # dnf4's ProcessLock: a pid file under persistdir
# Install-only: the names the dnf adapter knows (agent.guard.dnf.request) plus dnf's defaults
# (dnf.const.INSTALLONLYPKGS), by name and by what the package provides.
INSTALLONLY_NAMES = frozenset(DEFAULT_INSTALLONLY | {"kernel-PAE"})
INSTALLONLY_PROVIDES = ("installonlypkg(", "multiversion(kernel)")
RPM_QUERY_TIMEOUT_SECONDS = 120.0
_32BIT_ARCHES = ("i386", "i486", "i586", "i686", "athlon", "armv7hl", "armv7l")
SECTION_ACTIONS = {"installing": "install", "upgrading": "upgrade", "downgrading": "downgrade",
                   "reinstalling": "reinstall", "removing": "remove", "installing dependencies": "install",
                   "installing weak dependencies": "install", "removing dependent packages": "remove",
                   "removing unused dependencies": "remove", "obsoleting": "remove"}
_ERROR_LINE = re.compile(r"^(Error:|No match for argument|All matches were filtered out|Problem|"
                         r"Cannot add|Not found|Package .* is not installed|No package .* available)", re.I)
# dnf5's own failure lines, and what its actions plugin prints when an action (gpuguard's) refuses.
_DNF5_ERROR_LINE = re.compile(r"^(Failed to resolve the transaction|Transaction failed|Failed to|"
                              r"gpuguard: REFUSED|File .* on line \d+: .*Exit code)", re.I)


def nevra(name: str, version: str, arch: str) -> str:
    """``name-[epoch:]version-release.arch`` as dnf takes it (the arch left off when unknown)."""
    return f"{name}-{version}.{arch}" if arch else f"{name}-{version}"


def rpm_file_name(name: str, version: str, arch: str) -> str:
    """The file name rpmbuild and repositories use (no epoch): ``rocm-core-6.2.2-1.x86_64.rpm``."""
    evr = version.split(":", 1)[1] if ":" in version else version
    return f"{name}-{evr}.{arch or 'noarch'}.rpm"


def is_installonly(name: str, provides: Sequence[str]) -> bool:
    """Whether dnf installs this package side by side with its other versions (kernels)."""
    return name in INSTALLONLY_NAMES or any(p.startswith(INSTALLONLY_PROVIDES) for p in provides)


def parse_rpm_installed(text: str, patterns: Sequence[str]) -> Dict[str, InstalledPackage]:
    """Guarded packages from ``rpm -qa --qf RPM_QUERY_FORMAT``: ``name``, ``name@version`` for install-only
    packages, ``name:arch`` for the 32-bit twin of a multilib package."""
    out: Dict[str, InstalledPackage] = {}
    by_name: Dict[str, List[InstalledPackage]] = {}
    guarded = any_glob(patterns)  # one set lookup per package, not one fnmatch per pattern (100,000 may be named)
    for name, version, arch, provides in parse_rpm_rows(text):
        if name.startswith("gpg-pubkey") or not guarded(name):
            continue
        if is_installonly(name, provides):
            out[f"{name}@{version}"] = InstalledPackage(version, arch)
        else:
            by_name.setdefault(name, []).append(InstalledPackage(version, arch))
    for name, builds in by_name.items():
        builds.sort(key=lambda b: (b.arch in _32BIT_ARCHES, b.arch))
        out[name] = builds[0]
        for build in builds[1:]:
            out[f"{name}:{build.arch}"] = build
    return dict(sorted(out.items()))


def read_rpm_installed(host: Host, patterns: Sequence[str]) -> Dict[str, InstalledPackage]:
    """Installed packages matching the globs, from the rpm database under the host's root (``rpm -qa``)."""
    result = host.run(rpm_query_argv(str(host.root)), timeout_seconds=RPM_QUERY_TIMEOUT_SECONDS).check()
    return parse_rpm_installed(result.stdout, patterns)


def split_nevra(spec: str) -> Tuple[str, str, str]:
    """(name, version-release without epoch, arch) of a NEVRA or an .rpm file path."""
    base = spec.rsplit("/", 1)[-1]
    if base.endswith(".rpm"):
        base = base[:-4]
    nevr, _, arch = base.rpartition(".")
    if not nevr or "-" in arch:
        nevr, arch = base, ""  # no arch given (gpuguard always gives one)
    parts = nevr.rsplit("-", 2)
    if len(parts) != 3:
        return base, "", ""
    name, version, release = parts
    return name, f"{version.split(':', 1)[-1]}-{release}", arch


def parse_transaction(text: str) -> List[PlannedStep]:
    """The package table dnf prints before it asks (``Downgrading:``, ``Removing:``, ...).

    A row starts with one space; deeper-indented lines continue it: a long name stands alone and the rest of
    its row follows, or a long version pushes repository and size onto the next line; ``replacing`` lines
    (obsoletes) are continuations too.
    """
    steps: List[PlannedStep] = []
    action: Optional[str] = None
    pending: List[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Transaction Summary"):
            action, pending = None, []
            continue
        if not stripped or stripped.startswith("="):
            continue
        if not line.startswith(" ") and stripped.endswith(":"):
            action, pending = SECTION_ACTIONS.get(stripped[:-1].lower()), []
            continue
        if action is None or not line.startswith(" "):
            continue
        if line.startswith("  "):
            if not pending:
                continue
            tokens, pending = [*pending, *stripped.split()], []
        else:
            tokens = stripped.split()
        if len(tokens) < 3:
            pending = tokens
            continue
        name, version = tokens[0], tokens[2]
        steps.append(PlannedStep(action, name, version, "") if action == "remove"
                     else PlannedStep(action, name, "", version))
    return steps


def plan_problems(lines: Sequence[str], plan: Sequence[PlannedStep]) -> List[str]:
    """Where dnf's plan differs from the script: a line without its step, a package nobody asked to move."""
    problems = []
    asked = set()
    for line in lines:
        verb, _, spec = line.partition(" ")
        name, evr, _ = split_nevra(spec)
        asked.add(name)
        want_remove = verb == "remove"
        if not any(s.package == name and (s.action == "remove") == want_remove and
                   (s.old_version if want_remove else s.new_version).split(":", 1)[-1] == evr for s in plan):
            problems.append(f"'{line}' is not in dnf's plan")
    extra = sorted({s.package for s in plan} - asked)
    if extra:
        problems.append(f"dnf would also change {', '.join(extra)}")
    return problems


def render_script(targets: Sequence[str]) -> str:
    """The dnf shell script for rollback targets (``install SPEC`` / ``remove SPEC``, one package each).

    dnf shell refuses a local file once any job exists ("Cannot add local packages, because transaction job
    already exists"), so every cached file goes into the first line; dnf shell splits lines with shlex.
    """
    files = [t.partition(" ")[2] for t in targets if t.startswith("install /")]
    rest = [t.partition(" ") for t in targets if not t.startswith("install /")]
    lines = [" ".join(["install", *(shlex.quote(f) for f in files)])] if files else []
    lines += [f"{verb} {shlex.quote(spec)}" for verb, _, spec in rest]
    return "".join(f"{line}\n" for line in lines)


def dnf5_do_args(targets: Sequence[str]) -> List[str]:
    """The ``dnf5 do`` arguments for rollback targets: ``--action=VERB`` before each run of lines of one verb."""
    args: List[str] = ["do"]
    verb_before = None
    for target in targets:
        verb, _, spec = target.partition(" ")
        if verb != verb_before:
            args.append(f"--action={verb}")
            verb_before = verb
        args.append(spec)
    return args


def _exit(returncode: int) -> str:
    """``exit 1``, or ``killed by signal 13`` for a negative return code."""
    return f"killed by signal {-returncode}" if returncode < 0 else f"exit {returncode}"


def _dnf_lock_holder(path: str) -> Optional[int]:
    """The pid in dnf's lock file when that process is alive (dnf4 ProcessLock semantics), else None."""
    try:  # a FIFO in its place is no holder, and is not waited on
        pid = int(read_regular_file(path, 4096)[:20].strip() or b"0")
    except (OSError, ValueError):
        return None
    if pid <= 0 or pid == os.getpid():
        return None
    return pid if os.path.exists(f"/proc/{pid}") else None


class DnfTool:
    """dnf/rpm for one Host; ``options`` are put before every dnf command (e.g. ``-c``, ``--releasever``)."""

    manager = "rpm"

    def __init__(self, host: Host, timeout_seconds: float = 900.0, lock_timeout_seconds: float = 300.0,
                 options: Sequence[str] = (), paths: Optional[StatePaths] = None,
                 sleep: Callable[[float], None] = time.sleep, program: str = "dnf") -> None:
        self.host = host
        self.timeout_seconds = timeout_seconds
        self.lock_timeout_seconds = lock_timeout_seconds
        self.options = list(options)
        self.paths = paths or StatePaths()  # where the rollback script goes
        self.sleep = sleep
        self.program = program
        self._dnf5: Optional[bool] = None  # found on first use (is_dnf5), with the program to run

    def argv(self, *args: str) -> List[str]:
        """The dnf argv for this host (``--installroot`` when the root is not /)."""
        self.is_dnf5()  # settles which program runs
        root = [] if self.host.is_live else [f"--installroot={self.host.root}"]
        return [self.program, *root, *self.options, *args]

    def rpm_argv(self, *args: str) -> List[str]:
        return ["rpm", "--root", str(self.host.root), *args]

    def installed(self, patterns: Sequence[str]) -> Dict[str, InstalledPackage]:
        """Guarded installed packages from the rpm database."""
        return read_rpm_installed(self.host, patterns)

    @property
    def script_path(self) -> str:
        """Host path of the dnf shell script a rollback writes (under the state directory)."""
        return self.paths.dnf_script

    def _write_script(self, targets: Sequence[str]) -> str:
        from agent.files import write_atomically

        real = str(self.host.path(self.script_path))
        write_atomically(real, render_script(targets))
        return real

    def is_dnf5(self) -> bool:
        """Whether the dnf this tool runs is dnf5 (which has no ``dnf shell``): ``program`` is dnf5, or ``dnf``
        is a link to dnf5 (Fedora 41+), or there is no ``dnf`` but a ``dnf5``.

        Looked up under the host root, then (for a foreign root, whose commands run on this machine with
        ``--installroot``) on this machine.
        """
        if self._dnf5 is None:
            self._dnf5, self.program = self._detect()
        return self._dnf5

    def _detect(self) -> Tuple[bool, str]:
        if self.program.rsplit("/", 1)[-1] == "dnf5":
            return True, self.program
        if self.program != "dnf":
            return False, self.program
        hosts = [self.host] if self.host.is_live else [self.host, Host.for_root("/")]
        for host in hosts:
            if host.which("dnf") is not None:
                target = host.read_link("/usr/bin/dnf") or ""
                return target.rsplit("/", 1)[-1] == "dnf5", "dnf"
            if host.which("dnf5") is not None:
                return True, "dnf5"
        return False, "dnf"

    def _errors(self, output: str) -> List[str]:
        patterns = (_ERROR_LINE, _DNF5_ERROR_LINE) if self.is_dnf5() else (_ERROR_LINE,)
        lines = [line.strip() for line in output.splitlines()]
        return list(dict.fromkeys(line for line in lines if any(p.match(line) for p in patterns)))

    def _transaction_argv(self, mode: str, lines: Sequence[str]) -> List[str]:
        """``dnf MODE shell SCRIPT`` (dnf4), or ``dnf5 MODE do --action=...`` (dnf5)."""
        if self.is_dnf5():
            return self.argv(mode, *dnf5_do_args(lines))
        return self.argv(mode, "shell", self._write_script(lines))

    @property
    def mechanism(self) -> str:
        """How a rollback transaction is run, for the rollback event."""
        return "dnf5 do" if self.is_dnf5() else "dnf shell"

    def simulate(self, lines: Sequence[str]) -> Tuple[List[PlannedStep], Optional[str]]:
        """Resolve the rollback with ``--assumeno``: dnf's plan, and why it cannot be run (None when it can)."""
        result = self.host.run(self._transaction_argv("--assumeno", lines), timeout_seconds=300.0)
        output = result.stdout + "\n" + result.stderr
        plan = parse_transaction(result.stdout)
        errors = self._errors(output)
        if errors:
            return plan, "dnf could not plan the rollback: " + "; ".join(errors)
        if not plan:
            return plan, f"dnf could not plan the rollback ({_exit(result.returncode)}): " + \
                (output.strip().splitlines() or ["no output"])[-1]
        problems = plan_problems(lines, plan)
        if problems:
            return plan, "dnf's plan differs from the rollback: " + "; ".join(problems)
        return plan, None

    def apply(self, lines: Sequence[str]) -> Optional[str]:
        """Run the rollback script as one dnf transaction; why it failed, or None. The gpuguard dnf plugin, when
        installed, checks it like any other transaction."""
        result = self.host.run(self._transaction_argv("-y", lines), timeout_seconds=self.timeout_seconds)
        output = result.stdout + "\n" + result.stderr
        errors = self._errors(output)
        if result.returncode != 0 or errors:
            detail = "; ".join(errors) or (output.strip().splitlines() or ["no output"])[-1]
            return f"{self.mechanism} failed ({_exit(result.returncode)}): {detail}"
        return None

    def finish_pending(self) -> None:
        """Nothing to finish: an rpm transaction has no half-configured state like dpkg's (the check after the
        rollback compares every version)."""

    def verify_dependencies(self) -> Optional[str]:
        """``rpm -Va --nofiles``: None when every installed package's dependencies are met, else rpm's lines."""
        result = self.host.run(self.rpm_argv("-Va", "--nofiles", "--nodigest", "--nosignature"),
                               timeout_seconds=300.0)
        lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
        if result.returncode == 0 and not lines:
            return None
        return "rpm -Va --nofiles: " + ("; ".join(lines[:5]) or _exit(result.returncode))

    def download(self, name: str, version: str, arch: str, dest_dir: str) -> CommandResult:
        """``dnf download --destdir`` (dnf-plugins-core; built into dnf5) of one build into a host directory."""
        return self.host.run(self.argv("-q", "download", "--destdir", str(self.host.path(dest_dir)),
                                       nevra(name, version, arch)), timeout_seconds=300.0)

    def location(self, name: str, version: str, arch: str) -> Optional[str]:
        """Where a repository serves one build (``dnf repoquery --location``), or None."""
        result = self.host.run(self.argv("-q", "repoquery", "--location", nevra(name, version, arch)),
                               timeout_seconds=120.0)
        urls = [line.strip() for line in result.stdout.splitlines() if "://" in line]
        return urls[0] if result.returncode == 0 and urls else None

    def available_versions(self, specs: Sequence[str]) -> Dict[str, List[str]]:
        """Versions the repositories offer per name; ``specs`` may be names or globs (``kernel*``)."""
        if not specs:
            return {}
        # dnf5's --queryformat does not end each package with a newline, dnf4's does.
        query_format = "%{name}\t%{evr}\n" if self.is_dnf5() else "%{name}\t%{evr}"
        result = self.host.run(self.argv("-q", "repoquery", "--qf", query_format, *specs),
                               timeout_seconds=120.0).check()
        out: Dict[str, List[str]] = {}
        for line in result.stdout.splitlines():
            fields = line.strip().split("\t")
            if len(fields) == 2 and fields[0] and fields[1]:
                versions = out.setdefault(fields[0], [])
                if fields[1] not in versions:
                    versions.append(fields[1])
        return out

    def wait_for_rpm_lock(self) -> float:
        """Wait until neither rpm nor dnf holds the database; the seconds waited, CommandTimeout after the limit."""
        locks = [(p, record_lock_is_free) for p in RPM_LOCK_FILES]
        locks += [(p, lambda path: _dnf_lock_holder(path) is None) for p in DNF_LOCK_FILES]
        return wait_for_locks(self.host, locks, self.lock_timeout_seconds, self.sleep)
