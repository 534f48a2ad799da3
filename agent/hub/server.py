"""Run the hub under uvicorn: one process, one event loop, no reload, no access log; SIGINT/SIGTERM stop it
gracefully (listeners close, in-flight requests finish within ``shutdown_timeout_seconds``, the writer stores
what is queued, the store closes)."""

from __future__ import annotations

import socket
from typing import Any, List, Optional

from agent.errors import GpuguardError
from agent.hub.settings import HubSettings
from agent.hub.store import make_store, redact_url
from agent.hub.timeouts import BodyTimeout, with_header_timeout
from agent.log import get_logger

log = get_logger("hub.server")


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


def serve(settings: HubSettings) -> None:
    """Serve until SIGINT/SIGTERM; GpuguardError when the hub cannot start."""
    _check_hub_extra()
    import uvicorn

    from agent.hub.app import create_app

    store = make_store(settings.database_url, settings.sqlite_synchronous)
    app = BodyTimeout(create_app(settings, store), settings.body_timeout_seconds)

    class _Server(uvicorn.Server):
        async def startup(self, sockets: Optional[List[socket.socket]] = None) -> None:
            await super().startup(sockets=sockets)
            for server in self.servers:
                for sock in server.sockets:
                    host, port = sock.getsockname()[:2]
                    log.info("hub_listening", host=host, port=port, url=f"http://{host}:{port}",
                             database=redact_url(settings.database_url))

        def handle_exit(self, sig: int, frame: Any) -> None:
            # Graceful on the first SIGINT/SIGTERM, immediate on the second; unlike uvicorn's own handler the
            # signal is not re-raised afterwards, so a clean shutdown exits 0.
            if self.should_exit:
                self.force_exit = True
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
    server.run()
    if not server.started:
        raise GpuguardError(f"hub did not start on {settings.listen_host}:{settings.listen_port} "
                            "(address in use, or the store failed to open; see the log above)")
