"""``gpuguard run``: the agent daemon. Wiring only: jobs on a scheduler, signals, systemd notifications, shutdown.

Jobs (bodies in agent/daemon_jobs/) run on the resident's scheduler (agent/daemon_jobs/scheduler.py: each job on
its own thread, as apscheduler's BackgroundScheduler ran them with ``max_instances=1`` and ``coalesce=True``): a job
never overlaps itself and a slow one (a health check) never holds up the others. The main thread only waits for
signals:

    SIGTERM, SIGINT   finish the running job steps, flush metrics, exit 0
    SIGHUP            reload the config file and recompile the policy for the apt hook; an invalid file (or a
                      config child still running after CONFIG_RELOAD_TIMEOUT_SECONDS) is logged, the old one kept
    SIGUSR1           a package transaction happened (apt/dnf hook): guard check, snapshot and deliver now

The snapshot, the guard's rollback check and its guard-events forwarding, the health check, delivery's sending, and
the config file's validation (at start and on SIGHUP) run in short-lived child processes (agent/daemon_jobs/
children.py) so that the collectors, GPU bindings, policy engine, apt/dnf tooling, requests and pydantic never stay
resident; the daemon keeps the schedule, the outbox, delivery's backoff, heartbeats, metrics and the package watch,
and holds the settings as the config child hands them over (agent/daemon_jobs/resident_settings.py). SIGTERM
reaches a running child through ``stopping`` and is waited for. Tests that hand in fake hooks run every body
in-process. ``gpuguard run`` keeps OpenSSL and asyncio out of the process (agent/daemon_jobs/openssl.py,
lazy_asyncio.py).

Under systemd (``Type=notify``) it sends READY=1 once running, WATCHDOG=1 at half of WATCHDOG_USEC from a
scheduler job (so a wedged scheduler stops the pings), STATUS= lines, and STOPPING=1.
"""

from __future__ import annotations

import os
import select
import signal
import threading
from typing import TYPE_CHECKING, AbstractSet, Callable, Dict, Optional, Union

from agent.daemon_jobs.children import (
    HEARTBEAT_REASON,
    ChildJobFailed,
    DeliveryInChild,
    GuardCheckInChild,
    GuardEventsInChild,
    HealthInChild,
    LeanRound,
    PolicyFetchInChild,
    SnapshotInChild,
    load_config_in_child,
    remove_leftover_results,
    restore_in_child,
)
from agent.daemon_jobs.delivery import DeliveryJob
from agent.daemon_jobs.guard import CHECK_REASONS, GuardJob
from agent.daemon_jobs.guard_events import GuardEventForwarder, guard_events_path
from agent.daemon_jobs.health import HealthJob
from agent.daemon_jobs.health_schedule import HealthSchedule
from agent.daemon_jobs.heartbeat import HeartbeatJob, first_heartbeat_in_seconds, first_policy_fetch_in_seconds
from agent.daemon_jobs.hooks import Hooks, default_hooks
from agent.daemon_jobs.job_runner import JobRunner, without_retry
from agent.daemon_jobs.memory import limit_malloc_arenas
from agent.daemon_jobs.metrics import MetricsJob
from agent.daemon_jobs.protocol import ConfigRequest, ConfigResult
from agent.daemon_jobs.resident_settings import SettingsInForce
from agent.daemon_jobs.runtime import EventEmitter, Runtime, host_identity
from agent.daemon_jobs.scheduler import IntervalScheduler
from agent.daemon_jobs.systemd_notify import SystemdNotifier
from agent.daemon_jobs.watch import PackageWatcher
from agent.errors import ConfigError
from agent.host import Host
from agent.log import configure, get_logger
from agent.report.outbox import Outbox
from agent.statepaths import StatePaths

if TYPE_CHECKING:  # pragma: no cover
    from types import FrameType

    from agent.daemon_jobs.snapshot import SnapshotJob
    from agent.report.sender import Sender

log = get_logger("daemon")

# PRAGMA quick_check of the outbox this often (also at every open): damage is found before every job trips on it.
OUTBOX_CHECK_INTERVAL_SECONDS = 600.0
# A SIGHUP's config child (about 0.3 s) still running after this is killed and the reload fails: the main thread
# waits for it, and no later SIGHUP or SIGTERM is read until it ends (a config file on a hung mount, a FIFO).
CONFIG_RELOAD_TIMEOUT_SECONDS = 120.0
# With job children the policy fetch is asked right after each heartbeat (its probe carries the heartbeat's delivery:
# one lean child a minute, issue #45); its own schedule is only a backstop, this many heartbeat intervals apart.
FETCH_BACKSTOP_INTERVALS = 2
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)


class Daemon:
    """Owns the scheduler, the jobs and the signal loop of one ``gpuguard run``."""

    def __init__(self, config_path: str, settings: SettingsInForce, host: Host,
                 notifier: Optional[SystemdNotifier] = None, hooks: Optional[Hooks] = None,
                 job_children: Optional[bool] = None) -> None:
        self.config_path = config_path
        self.notifier = notifier or SystemdNotifier()
        # Heavy job bodies in child processes (agent/daemon_jobs/children.py) unless a test hands in fake hooks.
        self.job_children = hooks is None if job_children is None else job_children
        self.hooks = hooks if hooks is not None else Hooks() if self.job_children else default_hooks()
        view = settings.view
        os.makedirs(view.state_dir, mode=0o755, exist_ok=True)
        outbox = Outbox.open_or_recover(StatePaths(view.state_dir).outbox, view.max_events)
        emitter = EventEmitter(outbox, host_identity(host, view.host_id), host.hostname(), host.clock)
        self.runtime = Runtime(host=host, in_force=settings, state_dir=view.state_dir, outbox=outbox,
                               emitter=emitter, sender=self._sender(settings))
        self.runners: Dict[str, JobRunner] = {}
        self.scheduler: Optional[IntervalScheduler] = None
        self._metrics: Optional[MetricsJob] = None
        self._delivery: Optional[DeliveryJob] = None

    def _sender(self, settings: SettingsInForce) -> Optional["Sender"]:
        """The Sender for in-process delivery (tests); with job children each delivery child builds its own (requests
        stays out of the resident, issue #17), the config child having checked the token file and CA bundle."""
        if settings.view.endpoint_url is None or self.job_children:
            return None
        from agent.report.sender import sender_for  # requests only when it is needed

        return sender_for(settings.model().report)

    def _load_config(self, request: ConfigRequest) -> ConfigResult:
        """The config file validated: in a child, or in-process where the bodies run in-process (tests)."""
        rt = self.runtime
        if self.job_children:
            return load_config_in_child(self.config_path, str(rt.host.root), request, rt.state_dir, rt.stopping,
                                        timeout_seconds=CONFIG_RELOAD_TIMEOUT_SECONDS)
        from agent.daemon_jobs.child_main import load_config

        return load_config(self.config_path, rt.host, request)

    def _add(self, scheduler: IntervalScheduler, job_id: str, body: Callable[[str], Optional[float]],
             interval_seconds: float, first_in_seconds: Optional[float], refresh_metrics: bool = True,
             sticky_reasons: AbstractSet[str] = frozenset()) -> JobRunner:
        """Schedule a body every ``interval_seconds``, first after ``first_in_seconds`` (None: one interval);
        ``sticky_reasons``: a pending request with one of them is not replaced by a later one (JobRunner)."""
        metrics = self._metrics
        after = (lambda: metrics.run(f"after_{job_id}")) if refresh_metrics and metrics is not None else _nothing
        runner = JobRunner(job_id, body, self.runtime.stopping, after=after, quiet=not refresh_metrics,
                           trim=refresh_metrics, sticky_reasons=sticky_reasons)
        runner.scheduler = scheduler
        scheduler.add(job_id, runner, interval_seconds,
                      interval_seconds if first_in_seconds is None else first_in_seconds)
        self.runners[job_id] = runner
        return runner

    def _interval(self, job_id: str, intervals: Dict[str, float]) -> float:
        """The job's scheduled interval: the setting's, the policy fetch's a backstop with job children."""
        factor = FETCH_BACKSTOP_INTERVALS if job_id == "policy_fetch" and self.job_children else 1
        return intervals[job_id] * factor

    def start(self) -> None:
        limit_malloc_arenas()  # before the worker threads exist (agent/daemon_jobs/memory.py)
        rt, s, hooks, children = self.runtime, self.runtime.settings, self.hooks, self.job_children
        if children:
            remove_leftover_results(rt.state_dir)  # a killed daemon's children's, before any child runs
            restore_in_child(rt, self.config_path)  # what the previous run stored, before any job runs
        scheduler = self.scheduler = IntervalScheduler()
        intervals = s.intervals()
        self._metrics = MetricsJob(rt)
        self._add(scheduler, "metrics", without_retry(self._metrics.run), 60.0, 0.0, refresh_metrics=False)
        drain = DeliveryInChild(rt, self.config_path) if children else None
        delivery = self._delivery = DeliveryJob(rt, drain=drain)
        deliver = self._add(scheduler, "deliver", delivery.run, intervals["deliver"], 0.0)
        rt.emitter.on_enqueued = lambda: deliver.request("event_enqueued")
        health: Union[HealthJob, HealthInChild] = HealthInChild(rt, self.config_path) if children \
            else HealthJob(rt, hooks)
        # The schedule picks the mode (functional right after a change) and retries while the GPUs are busy.
        health_schedule = HealthSchedule(rt, health.run)
        health_runner = self._add(scheduler, "health", health_schedule.run, intervals["health"],
                                  s.health_first_run_seconds)
        if children:
            snapshot: Union[SnapshotInChild, "SnapshotJob"] = SnapshotInChild(rt, self.config_path,
                                                                             on_stack_changed=health_runner.request)
        else:
            from agent.daemon_jobs.snapshot import SnapshotJob  # collectors and GPU bindings: in-process only

            snapshot = SnapshotJob(rt, hooks.policy_check, on_stack_changed=health_runner.request)
        snap_runner = self._add(scheduler, "snapshot", without_retry(snapshot.run), intervals["snapshot"], 0.0)
        events_path = guard_events_path(rt)
        forwarder = GuardEventForwarder(rt, events_path)
        guard = GuardJob(rt, GuardEventsInChild(rt, self.config_path, forwarder) if children else forwarder.run,
                         on_checked=snap_runner.request,
                         check=GuardCheckInChild(rt, self.config_path) if children else None)
        # A package change asked just before the fetch's policy_bundle_installed (the package manager ran as the new
        # bundle landed) keeps its reason: the check covers the new policy too, and the snapshot and its post-change
        # health check follow only a check reason.
        guard_runner = self._add(scheduler, "guard", without_retry(guard.run), intervals["guard"], 0.0,
                                 sticky_reasons=CHECK_REASONS)
        watcher = PackageWatcher(rt.host, on_change=guard_runner.request, guard_events_path=events_path,
                                 on_guard_events=guard_runner.request)
        self._add(scheduler, "package_watch", without_retry(watcher.run), intervals["package_watch"], None,
                  refresh_metrics=False)
        rt.report_outbox_damage()  # found while opening it
        self._add(scheduler, "outbox_check", without_retry(rt.check_outbox), OUTBOX_CHECK_INTERVAL_SECONDS, None)
        # With job children the heartbeat does not wake delivery: the policy fetch asked right after it carries it.
        heartbeat = HeartbeatJob(rt, wake_delivery=not children)

        def beat(reason: str) -> None:
            try:
                heartbeat.run(reason)
            finally:
                if children:
                    self.runners["policy_fetch"].request(HEARTBEAT_REASON)

        heartbeat_runner = self._add(scheduler, "heartbeat", without_retry(beat), intervals["heartbeat"],
                                     first_heartbeat_in_seconds(s))
        # The hub's policy bundle, right after each heartbeat (in-process: on the heartbeat's interval); a new one
        # checked by the guard.
        def policy_changed(why: str) -> None:
            guard_runner.request(why)
            heartbeat_runner.request(why)

        lean_round = LeanRound(delivery, drain, deliver.request, deliver.run_at) if drain is not None else None
        fetch = PolicyFetchInChild(rt, self.config_path, policy_changed, in_child=children, lean_round=lean_round)
        self._add(scheduler, "policy_fetch", without_retry(fetch.run), self._interval("policy_fetch", intervals),
                  first_policy_fetch_in_seconds(s))
        if self.notifier.watchdog_seconds:
            self._add(scheduler, "watchdog", lambda reason: self.notifier.notify("WATCHDOG=1"),
                      self.notifier.watchdog_seconds / 2, None, refresh_metrics=False)
        scheduler.start()
        log.info("daemon_started", root=str(rt.host.root), state_dir=rt.state_dir, host_id=rt.emitter.host_id,
                 endpoint_url=s.endpoint_url, outbox_depth=rt.outbox.depth(),
                 watchdog_seconds=self.notifier.watchdog_seconds)
        self.notifier.notify("READY=1", f"STATUS=running; outbox depth {rt.outbox.depth()}")

    def reload(self) -> bool:
        """Re-read the config file (and recompile the policy) in a config child; on any problem keep the old
        settings."""
        rt = self.runtime
        try:
            new = self._load_config(ConfigRequest(in_force=rt.in_force.dump, compile_policy=True,
                                                  daemon_pid=os.getpid())).in_force()
        except (ConfigError, ChildJobFailed) as exc:
            path, problems = (exc.path, list(exc.problems)) if isinstance(exc, ConfigError) \
                else (self.config_path, [str(exc)])
            log.error("config_reload_failed", path=path, problems=problems, kept="previous configuration")
            self.notifier.notify("STATUS=running; config reload failed, previous configuration kept")
            return False
        configure(level=new.view.log_level)
        before = rt.settings.intervals()
        rt.in_force = new
        rt.sender = self._sender(new)
        rt.outbox.max_events = new.view.max_events
        rt.emitter.host_id = host_identity(rt.host, new.view.host_id)
        if self._delivery is not None:
            self._delivery.reset_backoff()  # the new endpoint, token or CA bundle deserves a try now
        after = new.view.intervals()
        for job_id, seconds in after.items():
            if before[job_id] != seconds and self.scheduler is not None:
                self.scheduler.set_interval(job_id, self._interval(job_id, after))
        log.info("config_reloaded", path=self.config_path, endpoint_url=new.view.endpoint_url)
        self.notifier.notify("STATUS=running; configuration reloaded")
        self.runners["guard"].request("config_reloaded")  # the recompiled policy may no longer allow the installed set
        self.runners["snapshot"].request("config_reloaded")
        self.runners["deliver"].request("config_reloaded")
        return True

    def stop(self) -> None:
        """Let running job steps finish, then flush metrics and close the outbox."""
        log.info("daemon_stopping")
        self.notifier.notify("STOPPING=1", "STATUS=stopping")
        self.runtime.stopping.set()
        if self.scheduler is not None:
            self.scheduler.shutdown()  # no job starts again; the running ones are waited for below
        for runner in self.runners.values():
            runner.wait_idle()
        try:
            MetricsJob(self.runtime).run("shutdown")
        except OSError as exc:
            log.warning("metrics_write_failed", error=str(exc))
        depth = self.runtime.outbox.depth()
        self.runtime.outbox.close()
        if self.runtime.sender is not None:
            self.runtime.sender.close()
        log.info("daemon_stopped", outbox_depth=depth)

    def serve(self) -> int:
        """Start, then handle signals in the main thread until SIGTERM/SIGINT; returns the exit code."""
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        previous = {sig: signal.signal(sig, _ignore) for sig in _SIGNALS}
        old_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        try:
            self.start()
            while True:
                select.select([read_fd], [], [])
                try:
                    received = os.read(read_fd, 64)
                except BlockingIOError:
                    continue
                for signum in received:
                    if signum in (signal.SIGTERM, signal.SIGINT):
                        log.info("signal_received", signal=signal.Signals(signum).name)
                        self.stop()
                        return 0
                    if signum == signal.SIGHUP:
                        log.info("signal_received", signal="SIGHUP")
                        self.reload()
                    elif signum == signal.SIGUSR1:
                        log.info("signal_received", signal="SIGUSR1")
                        self.runners["guard"].request("package_transaction")  # then the snapshot
                        self.runners["deliver"].request("package_transaction")
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(read_fd)
            os.close(write_fd)


def _nothing() -> None:
    return None


def _ignore(signum: int, frame: Optional[FrameType]) -> None:
    """Python-level handler: the C handler already wrote the signal number to the wakeup pipe."""


def run_daemon(config_path: str, host: Host) -> int:
    """Validate the config file in a config child (every problem at once, the token file and CA bundle checked), then
    serve until told to stop."""
    first = ConfigRequest(daemon_pid=os.getpid())
    settings = load_config_in_child(config_path, str(host.root), first, None, threading.Event()).in_force()
    daemon = Daemon(config_path, settings, host)
    configure(level=settings.view.log_level)
    return daemon.serve()
