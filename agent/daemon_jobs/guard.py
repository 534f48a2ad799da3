"""The guard job: after a package change roll back what bypassed apt, forward guard events, then ask for a snapshot.

Order on a dpkg status change (the package watcher, SIGUSR1): ``check_and_rollback`` first (it waits for the
dpkg lock, compares with the known-good set and rolls a ``dpkg -i`` violation back when the policy says so,
recording its PolicyViolation / Rollback records in guard-events.jsonl), then the forwarder commits those records
to the outbox, then the snapshot job runs, so the snapshot's diff comes after the rollback's events and shows the
state the rollback left. When the guard-events file alone grew (the apt hook blocked something), only the
forwarder runs. A new compiled policy (a hub bundle installed by the policy fetch, a SIGHUP recompile) runs the check
too, with no package change: the installed set may violate the new policy (a revert bundle after an aborted rollout
rolls the host back to the set before the rollout, agent.guard.rollback.core). Every check, however it ends, also
records the packages installed at a version the deny list in force denies (agent/bundle/deny.py), so a known-bad
version a package change put in place is flagged then, not only at the next policy fetch. With a Host root other
than ``/`` the check runs against that root as a chroot (that is how ``check_and_rollback`` runs apt there, or dnf
with ``--installroot``); it is skipped without a compiled policy or without a package database (dpkg status, or rpm's
database under /var/lib/rpm or /usr/lib/sysimage/rpm).

A failure of the check is logged (``guard_check_failed``) and reported as a Rollback event with
``succeeded = false``; it never ends the job, the forwarding or the snapshot.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import TYPE_CHECKING, Callable, List, Optional

from agent.daemon_jobs.protocol import GuardChecked
from agent.daemon_jobs.runtime import Runtime
from agent.errors import ConfigError, GpuguardError, Interrupted
from agent.files import open_regular_file
from agent.host import Host
from agent.hostfacts.rpmdb import rpm_database_files
from agent.log import get_logger
from agent.report.plain import PlainRollback
from agent.statepaths import StatePaths

if TYPE_CHECKING:  # pragma: no cover
    from agent.config import Settings
    from agent.guard.rollback.core import GuardResult

log = get_logger("guard_job")

DPKG_STATUS = "/var/lib/dpkg/status"
# Reasons that mean "the installed set may have moved": check (and maybe roll back) before the snapshot.
CHECK_REASONS = frozenset({"package_change", "package_transaction"})
# Reasons that mean "the policy in force may have moved" (a bundle from the hub compiled, SIGHUP's recompile): check
# even though no package moved, since the installed set may violate the new policy (a revert bundle after an aborted
# rollout); the state key still skips the check when the compiled policy's bytes did not change.
POLICY_REASONS = frozenset({"policy_bundle_installed", "config_reloaded"})

# check_and_rollback once, in a child or in-process: what it found, or its error raised.
CheckFunction = Callable[[], Optional[GuardChecked]]
# Forward the new guard-events lines to the outbox (in a child or in-process): how many became events.
ForwardFunction = Callable[[str], int]


def _default_check(host: Host, settings: Settings, stopping: threading.Event) -> GuardResult:
    """``check_and_rollback`` whose wait for the package manager's lock gives up when the daemon is stopping:
    during an apt run (gpuguard's own prerm among them) the check waits for dpkg's lock, and ``systemctl stop``
    then hung until TimeoutStopSec and a SIGKILL. What it saw goes into the health gate's window
    (agent/guard/rollback/health_gate.py): every change the guard sees is one the next health verdict covers."""
    from agent.guard.manager import backend_for  # apt tooling only once a check is due
    from agent.guard.rollback.core import check_and_rollback

    def sleep(seconds: float) -> None:
        if stopping.wait(seconds):
            raise Interrupted("the daemon is stopping: gave up waiting for the package manager's lock")

    from agent.bundle.install import BundleInstaller
    from agent.daemon_jobs.policy_fetch import flag_denied_installed
    from agent.guard.rollback.health_gate import note_guard_check

    paths = StatePaths(settings.agent.state_dir)
    backend = backend_for(host, settings.guard, paths, sleep=sleep)
    try:
        result = check_and_rollback(host, settings.guard, paths, backend)
    finally:
        # A package change may have put a known-bad version in place (or taken one away): flagged now, not only
        # at the next policy fetch (agent/bundle/deny.py).
        flag_denied_installed(host, BundleInstaller(host, settings.guard, settings.agent.state_dir))
    note_guard_check(host, paths, backend, result, host.clock().timestamp())  # the health gate's window
    return result


class GuardJob:
    """Runs the rollback check when the installed set may have moved, forwards guard events, then ``on_checked``."""

    def __init__(self, runtime: Runtime, forward: ForwardFunction,
                 on_checked: Callable[[str], None] = lambda reason: None,
                 check: Optional[CheckFunction] = None) -> None:
        self.runtime = runtime
        self.forward = forward
        self.on_checked = on_checked
        self._check: CheckFunction = check or (lambda: GuardChecked.of(_default_check(
            runtime.host, runtime.job_settings(), runtime.stopping)))
        self._checked_once = False
        self._last_checked_key: Optional[str] = None

    def run(self, reason: str = "interval") -> None:
        wants_check = reason in CHECK_REASONS or reason in POLICY_REASONS or not self._checked_once
        try:
            if wants_check:
                self._checked_once = True
                self.check(reason)
            self.forward(reason)
        finally:
            if reason in CHECK_REASONS:
                self.on_checked(reason)  # the snapshot follows even when the check or forwarding failed

    def _package_db_files(self) -> List[str]:
        """The package database files whose bytes say whether the installed set may have moved."""
        host = self.runtime.host
        if os.path.exists(host.file(DPKG_STATUS)):
            return [DPKG_STATUS]
        return rpm_database_files(str(host.root)) or [DPKG_STATUS]  # absent: the check is skipped

    def _state_key(self) -> Optional[str]:
        """A hash of the package database and the compiled policy; None when either is missing (nothing to check)."""
        host = self.runtime.host
        digest = hashlib.sha256()
        for host_path in (*self._package_db_files(), StatePaths(self.runtime.settings.state_dir).compiled_policy):
            try:  # streamed, and never blocking on a FIFO in place of either file
                with open_regular_file(host.file(host_path)) as stream:
                    for chunk in iter(lambda: stream.read(1 << 20), b""):
                        digest.update(chunk)
            except FileNotFoundError:
                return None
            except OSError as exc:
                log.warning("guard_check_input_unreadable", path=host_path, error=exc.strerror or str(exc))
                return None
            digest.update(b"\0")
        return digest.hexdigest()

    def check(self, reason: str) -> Optional[GuardChecked]:
        """Call ``check_and_rollback`` unless nothing it reads changed since the last check; its result or None."""
        rt = self.runtime
        key = self._state_key()
        if key is None:
            log.debug("guard_check_skipped", reason=reason, cause="no compiled policy or no package database")
            return None
        if key == self._last_checked_key:
            # The change was the rollback's own (or a failed one's): never loop on it.
            log.debug("guard_check_skipped", reason=reason,
                      cause="package database and policy unchanged since last check")
            return None
        try:
            result = self._check()
        except Interrupted as exc:  # stopping while waiting for the lock: nothing was checked, nothing failed
            log.info("guard_check_interrupted", reason=reason, detail=str(exc))
            return None
        except Exception as exc:  # a failed check or rollback is data, never the daemon's end
            detail = f"{type(exc).__name__}: {exc}"
            expected = isinstance(exc, (GpuguardError, OSError))  # a traceback only for a bug
            log.error("guard_check_failed", reason=reason, error=detail, exc_info=not expected)
            rt.emitter.emit(PlainRollback(reason="guard_check_failed", from_versions={}, to_versions={},
                                          succeeded=False, detail=f"the rollback check failed: {detail}"[:4000]),
                            severity="critical")
            self._last_checked_key = self._state_key()
            return None
        self._last_checked_key = self._state_key()
        if result is None:
            return None
        level = log.error if result.status == "failed" else log.warning if result.status in (
            "violations", "no_known_good", "override", "rolled_back") else log.info
        level("guard_checked", reason=reason, status=result.status, detail=result.detail,
              reboot_required=result.reboot_required)
        return result


def recompile_policy(host: Host, settings: Settings) -> bool:
    """Compile the policy files to the compiled policy the apt hook reads, as ``gpuguard policy compile`` does.

    An invalid policy logs every problem at once (``policy_compile_failed``) and keeps the old compiled file;
    without policy files nothing happens. True when a new compiled file was written.
    """
    from agent.bundle.source import compile_source, policy_source
    from agent.policy.load import write_compiled

    try:
        chosen = policy_source(host, settings.guard, settings.agent.state_dir)
    except GpuguardError as exc:  # a damaged bundle state file: the compiled policy in force stays
        log.error("policy_compile_failed", problems=[str(exc)], kept="previous compiled policy")
        return False
    source = chosen.policy_path
    if not os.path.exists(source):
        log.info("policy_compile_skipped", path=source, source=chosen.description, cause="no policy files")
        return False
    target = host.path(StatePaths(settings.agent.state_dir).compiled_policy)
    try:
        _, compiled = compile_source(chosen, host, settings.agent.state_dir)
        write_compiled(str(target), compiled)
    except ConfigError as exc:  # PolicyError: every problem of every file
        log.error("policy_compile_failed", path=exc.path, problems=list(exc.problems),
                  kept="previous compiled policy")
        return False
    except (GpuguardError, OSError) as exc:
        log.error("policy_compile_failed", path=str(source), problems=[str(exc)], kept="previous compiled policy")
        return False
    log.info("policy_compiled", name=compiled.name, sources=compiled.sources, source=chosen.description,
             path=str(target))
    return True
