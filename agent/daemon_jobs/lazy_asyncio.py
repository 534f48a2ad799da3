"""asyncio left unloaded in the resident daemon until something really uses it.

structlog (``structlog/_native.py``, ``stdlib.py``) imports asyncio at its top and never uses it in ``gpuguard run``
(only in its ``a*`` coroutine methods); apscheduler (``apscheduler/util.py``, ``from asyncio import
iscoroutinefunction``) did too, until the resident left it for agent/daemon_jobs/scheduler.py. Loaded, asyncio and
the modules only it brings (its event loops, ``subprocess``, ``selectors``...) held about 1.3 MiB of the resident's
RSS, a twentieth (issue #28). The stand-in works under apscheduler too (tests/daemon/test_lazy_asyncio.py).

Since Python 3.12 every ``logging.LogRecord`` asks the asyncio in ``sys.modules`` for its ``current_task()`` (the
record's ``taskName``), and structlog builds one at import (``structlog/stdlib.py``): through ``__getattr__`` that
loaded the real asyncio in every resident on 3.12 (Ubuntu 24.04; issue #45). The stand-in answers ``current_task``
itself while the real asyncio is not loaded, as asyncio does outside a running loop (``RuntimeError``; logging then
records ``taskName = None``): no loop can run before asyncio is loaded.

:func:`defer_asyncio` puts a stand-in in ``sys.modules``: the first read of any attribute (``asyncio.get_running_loop``,
its ``__all__``) imports the real asyncio and answers from it, and from then on ``import asyncio`` gives the real
module; ``iscoroutinefunction``, which apscheduler binds at import, does the same when first called. The stand-in
has asyncio's ``__path__`` (found, not run), so ``from asyncio import iscoroutinefunction`` does not load it to ask
whether asyncio is a package. So nothing that uses asyncio breaks: it only loads later, which in the daemon is never.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Callable

_lock = threading.RLock()


class DeferredAsyncio(types.ModuleType):
    """Stands in for asyncio in ``sys.modules`` until an attribute is read."""

    def __getattr__(self, name: str) -> object:
        return getattr(_real_asyncio(), name)


def _real_asyncio() -> types.ModuleType:
    with _lock:
        found = sys.modules.get("asyncio")
        if isinstance(found, DeferredAsyncio):
            del sys.modules["asyncio"]
            try:
                return importlib.import_module("asyncio")
            except BaseException:
                sys.modules["asyncio"] = found
                raise
        if found is None:
            return importlib.import_module("asyncio")
        return found


def _current_task(loop: object = None) -> object:
    found = sys.modules.get("asyncio")
    if isinstance(found, DeferredAsyncio) or found is None:
        raise RuntimeError("no running event loop")  # asyncio's own answer outside a loop
    return found.current_task(loop)


def _iscoroutinefunction(func: Callable[..., object]) -> bool:
    real: Callable[[Callable[..., object]], bool] = _real_asyncio().iscoroutinefunction
    return real(func)


def defer_asyncio() -> bool:
    """Put the stand-in in place (call before structlog is imported); False when asyncio is loaded
    already (then nothing changes)."""
    with _lock:
        if "asyncio" in sys.modules:
            return False
        spec = importlib.util.find_spec("asyncio")
        if spec is None or spec.submodule_search_locations is None:
            return False
        stand_in = DeferredAsyncio("asyncio", "asyncio, imported when first used (agent/daemon_jobs/lazy_asyncio.py)")
        stand_in.__path__ = list(spec.submodule_search_locations)
        stand_in.iscoroutinefunction = _iscoroutinefunction  # type: ignore[attr-defined]
        stand_in.current_task = _current_task  # type: ignore[attr-defined]
        sys.modules["asyncio"] = stand_in
        return True
