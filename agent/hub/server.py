"""Run the hub under uvicorn: no reload, no access log; SIGINT/SIGTERM stop it gracefully (listeners close,
in-flight requests finish within ``shutdown_timeout_seconds``, the writer stores what is queued, the store closes).

With ``workers = 1`` (the default) the hub is one process and one event loop. With ``workers = N`` the main
process binds the listening socket and forks N worker processes that accept on it, each with its own event loop,
group-commit writer and database connections; the main process only supervises:

- it says ``hub_listening`` once every worker has opened the store and serves;
- a worker that fails to start (the database refused, the schema is newer) makes the whole hub exit non-zero
  at once, with the worker's reason in the log: never a half-started hub that accepts connections nobody answers;
- a worker that dies later is started again (``hub_worker_restarted``); three that die within
  ``_CRASH_WINDOW_SECONDS`` of starting stop the hub (``hub_workers_crash_looping``);
- SIGTERM/SIGINT are passed on to every worker, and the hub exits 0 once they all stopped cleanly.
"""

from __future__ import annotations

import datetime as dt
import os
import select
import signal
import socket
import struct
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from agent.errors import GpuguardError, HubError
from agent.hub.header_timeout import with_header_timeout
from agent.hub.rows import utc_now
from agent.hub.settings import HubSettings
from agent.hub.store import make_store, redact_url
from agent.log import get_logger

log = get_logger("hub.server")

_BACKLOG = 2048  # uvicorn's default
_READY_TIMEOUT_SECONDS = 120.0  # a worker opening the store waits at most connect_timeout per connection
_CRASH_WINDOW_SECONDS = 10.0
_MAX_QUICK_CRASHES = 3
_STARTUP_FAILURE = 3  # uvicorn's exit code when the lifespan (store open) failed
_SIGNAL_REPEAT_SECONDS = 1.0


def _check_hub_extra() -> None:
    try:
        import fastapi  # noqa: F401 - checked here so the error names the extra, not a module deep in app.py
        import uvicorn  # noqa: F401 - serve() imports it again once the extra is known to be there
    except ImportError as exc:
        raise GpuguardError(f"the hub needs its extra dependencies: pip install 'gpuguard[hub]' ({exc})") from None


def _http_protocol() -> type:
    """uvicorn's "auto" choice: httptools when it is installed, h11 otherwise."""
    try:
        import httptools  # noqa: F401 - only whether it is there
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return HttpToolsProtocol


def _not_started(settings: HubSettings, why: str = "") -> HubError:
    return HubError(f"hub did not start on {settings.listen_host}:{settings.listen_port} "
                    f"({why or 'address in use, or the store failed to open'}; see the log above)")


def _log_listening(settings: HubSettings, host: str, port: int) -> None:
    log.info("hub_listening", host=host, port=port, url=f"http://{host}:{port}",
             database=redact_url(settings.database_url), workers=settings.workers)


def _run_server(settings: HubSettings, sock: Optional[socket.socket] = None, ready_fd: Optional[int] = None,
                clock: Callable[[], dt.datetime] = utc_now) -> int:
    """One uvicorn server in this process: on its own (``sock`` None) or as a worker on an inherited socket that
    reports readiness on ``ready_fd``; the app reads the time from ``clock``. Returns 0 after a clean stop; 1 when
    it never started."""
    import uvicorn

    from agent.hub.app import create_app
    from agent.hub.middleware import BodyTimeout

    store = make_store(settings.database_url, settings.sqlite_synchronous)
    # Opened here, not only in the lifespan, so a refusal is this process's one-line error (StoreError) rather
    # than a traceback from the framework's lifespan; the lifespan's open is then a no-op.
    store.open()
    app = BodyTimeout(create_app(settings, store, clock=clock), settings.body_timeout_seconds)

    class _Server(uvicorn.Server):
        async def startup(self, sockets: Optional[List[socket.socket]] = None) -> None:
            await super().startup(sockets=sockets)
            if self.should_exit:
                return
            if ready_fd is not None:
                os.write(ready_fd, struct.pack("i", os.getpid()))
                return
            for server in self.servers:
                for listener in server.sockets:
                    host, port = listener.getsockname()[:2]
                    _log_listening(settings, host, port)

        first_signal_at = 0.0

        def handle_exit(self, sig: int, frame: Any) -> None:
            # Graceful on the first SIGINT/SIGTERM, immediate on a second one; unlike uvicorn's own handler the
            # signal is not re-raised afterwards, so a clean shutdown exits 0. A worker gets each signal twice
            # when systemd (KillMode=control-group) or a terminal signals the whole group and the main process
            # passes it on too: a repeat within _SIGNAL_REPEAT_SECONDS is that echo, not a second signal.
            now = time.monotonic()
            if self.should_exit:
                if now - self.first_signal_at > _SIGNAL_REPEAT_SECONDS:
                    self.force_exit = True
                return
            self.first_signal_at = now
            self.should_exit = True

        async def shutdown(self, sockets: Optional[List[socket.socket]] = None) -> None:
            log.info("hub_stopping", grace_seconds=settings.shutdown_timeout_seconds)
            await super().shutdown(sockets=sockets)

    config = uvicorn.Config(
        app, host=settings.listen_host, port=settings.listen_port, lifespan="on", log_config=None,
        access_log=False, server_header=False, proxy_headers=False, workers=1, reload=False,
        timeout_graceful_shutdown=int(settings.shutdown_timeout_seconds) or None,
        http=with_header_timeout(_http_protocol(), settings.header_timeout_seconds),
    )
    server = _Server(config)
    try:
        server.run(sockets=None if sock is None else [sock])
    except SystemExit as exc:  # uvicorn exits 3 when the lifespan (opening the store) failed
        if exc.code not in (None, 0, _STARTUP_FAILURE):
            raise
    return 0 if server.started else 1


def serve(settings: HubSettings, clock: Callable[[], dt.datetime] = utc_now) -> None:
    """Serve until SIGINT/SIGTERM; HubError when the hub (or any of its workers) cannot start. ``clock`` is the
    app's now (the real one; tests give a fixed one)."""
    _check_hub_extra()
    if settings.workers == 1:
        if _run_server(settings, clock=clock) != 0:
            raise _not_started(settings)
        return
    _Supervisor(settings, clock).run()


def _bind(settings: HubSettings) -> socket.socket:
    family = socket.AF_INET6 if ":" in settings.listen_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.listen_host, settings.listen_port))
    except OSError as exc:
        sock.close()
        raise _not_started(settings, exc.strerror or str(exc)) from None
    sock.listen(_BACKLOG)
    sock.set_inheritable(True)
    return sock


class _Supervisor:
    """The main process of a hub with several workers: binds, forks, waits for readiness, supervises."""

    def __init__(self, settings: HubSettings, clock: Callable[[], dt.datetime] = utc_now) -> None:
        self.settings = settings
        self.clock = clock
        self.workers: Dict[int, float] = {}  # pid -> when it was started (monotonic)
        self.stopping = False
        self._stopping_logged = False
        self.stopped_uncleanly = False
        self.quick_crashes = 0

    def run(self) -> None:
        sock = _bind(self.settings)
        ready_r, ready_w = os.pipe()
        try:
            for _ in range(self.settings.workers):
                self._fork(sock, ready_w)
            previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
            try:
                self._wait_ready(ready_r)
                host, port = sock.getsockname()[:2]
                _log_listening(self.settings, host, port)
                self._supervise(sock, ready_w, ready_r)
            except BaseException:
                self._stop_all()
                raise
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        finally:
            sock.close()
            os.close(ready_r)
            os.close(ready_w)

    def _fork(self, sock: socket.socket, ready_w: int) -> None:
        pid = os.fork()
        if pid == 0:  # the worker: serve on the inherited socket, never return into the caller's stack
            code = 1
            try:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                code = _run_server(self.settings, sock, ready_w, self.clock)
            except GpuguardError as exc:  # the reason (StoreError: the database refused) is one line
                log.error("hub_worker_failed", pid=os.getpid(), error=str(exc))
            except BaseException as exc:  # noqa: BLE001 - reported, then the worker exits non-zero
                log.error("hub_worker_failed", pid=os.getpid(), error=f"{type(exc).__name__}: {exc}")
            finally:
                os._exit(code)
        self.workers[pid] = time.monotonic()
        log.info("hub_worker_started", pid=pid)

    def _on_signal(self, sig: int, frame: Any) -> None:
        # Nothing is logged here: a signal that lands while this thread writes a log line would wait forever for
        # the log's write lock, which the interrupted write holds. The supervising loop says hub_stopping.
        self.stopping = True
        for pid in list(self.workers):
            try:
                os.kill(pid, sig)  # a second signal reaches the workers too: they stop at once
            except ProcessLookupError:
                pass

    def _log_stopping_once(self) -> None:
        if self.stopping and not self._stopping_logged:
            self._stopping_logged = True
            log.info("hub_stopping", grace_seconds=self.settings.shutdown_timeout_seconds,
                     workers=len(self.workers))

    def _reap(self) -> List[Tuple[int, int, float]]:
        """Workers that exited since the last call: (pid, exit code, seconds it ran)."""
        gone = []
        for pid in list(self.workers):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done:
                started = self.workers.pop(pid)
                gone.append((pid, os.waitstatus_to_exitcode(status), time.monotonic() - started))
        return gone

    def _wait_ready(self, ready_r: int) -> None:
        ready: Set[int] = set()
        deadline = time.monotonic() + _READY_TIMEOUT_SECONDS
        while len(ready) < self.settings.workers:
            if self.stopping:
                self._log_stopping_once()
                raise _not_started(self.settings, "stopped by a signal while starting")
            for pid, code, _ in self._reap():
                log.error("hub_worker_failed_to_start", pid=pid, exit_code=code)
                raise _not_started(self.settings, f"worker {pid} exited with {code} while starting")
            if time.monotonic() > deadline:
                raise _not_started(self.settings, f"workers not ready within {_READY_TIMEOUT_SECONDS:g} s")
            readable, _, _ = select.select([ready_r], [], [], 0.1)
            if readable:
                data = os.read(ready_r, 4 * 64)
                ready.update(struct.unpack(f"{len(data) // 4}i", data[: len(data) // 4 * 4]))

    def _supervise(self, sock: socket.socket, ready_w: int, ready_r: int) -> None:
        while self.workers:
            time.sleep(0.2)
            self._log_stopping_once()
            if select.select([ready_r], [], [], 0)[0]:
                os.read(ready_r, 4 * 64)  # restarted workers say they are ready; nothing waits for it
            for pid, code, ran_seconds in self._reap():
                if self.stopping:
                    # -SIGTERM/-SIGINT: a worker still starting when the signal came (uvicorn's handlers not yet
                    # in place) stopped as told.
                    if code not in (0, -signal.SIGTERM, -signal.SIGINT):
                        log.warning("hub_worker_stopped_uncleanly", pid=pid, exit_code=code)
                        self.stopped_uncleanly = True
                    continue
                self.quick_crashes = self.quick_crashes + 1 if ran_seconds < _CRASH_WINDOW_SECONDS else 0
                if self.quick_crashes >= _MAX_QUICK_CRASHES:
                    log.error("hub_workers_crash_looping", pid=pid, exit_code=code, crashes=self.quick_crashes)
                    raise HubError(f"hub workers keep exiting (last: {pid} with {code}); see the log above")
                log.error("hub_worker_exited", pid=pid, exit_code=code, ran_seconds=round(ran_seconds, 1))
                self._fork(sock, ready_w)
                log.info("hub_worker_restarted", replaced_pid=pid)
        if self.stopped_uncleanly:
            raise HubError("a hub worker did not stop cleanly; see the log above")

    def _stop_all(self) -> None:
        for pid in list(self.workers):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + self.settings.shutdown_timeout_seconds + 10
        while self.workers and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.05)
        for pid in list(self.workers):
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.workers.pop(pid, None)
