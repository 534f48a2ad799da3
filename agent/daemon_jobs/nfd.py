"""The NFD features file: rewritten after every job whose state it shows changed, and every half lifetime so its
labels never expire while the daemon lives (agent/integrations/nfd.py renders and writes it)."""

from __future__ import annotations

import datetime as dt
import os
import threading
from typing import Optional, Tuple

from agent import __version__
from agent.daemon_jobs.runtime import Runtime
from agent.errors import GpuguardError
from agent.integrations.nfd import NfdView, body_of, render_features, write_features
from agent.log import get_logger
from agent.statepaths import StatePaths

log = get_logger("nfd")


class PolicyName:
    """The compiled policy's name, read again only when the file changed (one stat per run otherwise)."""

    def __init__(self) -> None:
        self._key: Optional[Tuple[int, int, int]] = None
        self._name: Optional[str] = None

    def __call__(self, path: str) -> Optional[str]:
        from agent.policy.compiled import read_compiled

        try:
            info = os.stat(path)
        except OSError:
            return None  # no policy installed: compliance is unknown and so is its name
        key = (info.st_ino, info.st_mtime_ns, info.st_size)
        if key != self._key:
            try:
                name: Optional[str] = read_compiled(path).name
            except GpuguardError:
                name = None  # a broken file is the guard's and the snapshot's to report
            self._key, self._name = key, name
        return self._name


def nfd_view(runtime: Runtime, policy_name: Optional[str] = None) -> NfdView:
    """Gather what the features file shows from the daemon's state (the metrics textfile's source), the
    reboot marker a rollback leaves and the rollback coverage (read as ``gpuguard status`` reads them)."""
    from agent.integrations.reboot import booted_at_seconds
    from agent.rollback_coverage import read_coverage
    from agent.status.reboot import read_reboot_required

    paths = StatePaths(runtime.settings.state_dir)
    reboot = read_reboot_required(runtime.host.file(paths.reboot_required_packages),
                                  booted_at_seconds(runtime.host)) is not None
    coverage = read_coverage(runtime.host.file(paths.rollback_coverage), str(runtime.host.root))
    state = runtime.state
    with state.lock:
        facts = state.snapshot_facts
        return NfdView(agent_version=__version__, compliant=state.compliant, policy=policy_name,
                       violated_rules=len(state.violated_rules), pairing=state.pairing,
                       snapshot_at_seconds=facts.taken_at_seconds if facts else None,
                       finding_kinds=facts.finding_kinds if facts else (),
                       health_status=state.last_health_status, health_at_seconds=state.last_health_at_seconds,
                       rollback_needs_reboot=reboot,
                       rollback_guarded=coverage.guarded if coverage else None,
                       rollback_restorable=coverage.restorable if coverage else None,
                       rollback_exact=not coverage.inexact if coverage else None)


class NfdJob:
    """Writes the features file when what it shows changed or half its lifetime has passed since the last write.

    Not at shutdown: a stopped daemon's labels are meant to lapse at their expiry time."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._body: Optional[str] = None
        self._path: Optional[str] = None
        self._written_at: Optional[dt.datetime] = None
        self._absent_logged = False
        self._policy_name = PolicyName()
        self._lock = threading.Lock()

    def run(self, reason: str = "interval") -> None:
        settings = self.runtime.settings
        path = settings.nfd_path
        if path is None or reason == "shutdown":
            return
        with self._lock:
            if not os.path.isdir(os.path.dirname(path) or "."):
                # No NFD on this host (write_features never creates its directory): nothing to render, so the
                # compiled policy's reader, the reboot marker's and the coverage's stay out of the resident.
                self._log_absent(path)
                return
            now = self.runtime.host.clock()
            lifetime = dt.timedelta(seconds=settings.nfd_lifetime_seconds)
            policy = self._policy_name(self.runtime.host.file(StatePaths(settings.state_dir).compiled_policy))
            text = render_features(nfd_view(self.runtime, policy), now + lifetime)
            fresh = self._written_at is not None and now - self._written_at < lifetime / 2
            if fresh and path == self._path and body_of(text) == self._body:
                return
            try:
                written = write_features(path, text)
            except (OSError, ValueError) as exc:
                log.warning("nfd_write_failed", path=path, error=str(exc))
                return
            if not written:
                self._log_absent(path)
                return
            self._body, self._path, self._written_at = body_of(text), path, now
            log.debug("nfd_written", path=path, reason=reason)

    def _log_absent(self, path: str) -> None:
        if not self._absent_logged:
            log.info("nfd_directory_absent", path=path)
            self._absent_logged = True
