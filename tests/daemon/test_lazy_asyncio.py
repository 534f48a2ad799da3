"""asyncio stays unloaded in the resident until used (agent/daemon_jobs/lazy_asyncio.py), and works when it is.

Each check runs in a fresh interpreter: the stand-in is for the process's whole life.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_fresh_python

_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
{before}
from agent.daemon_jobs.lazy_asyncio import defer_asyncio
deferred = defer_asyncio()
import structlog
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.util import iscoroutinefunction_partial
loaded_after_imports = "asyncio.base_events" in sys.modules
async def coroutine():
    return 42
def plain():
    return 0
checks = [iscoroutinefunction_partial(coroutine), iscoroutinefunction_partial(plain)]
import asyncio
answer = asyncio.run(coroutine())
import asyncio.events
print(json.dumps({{"deferred": deferred, "loaded_after_imports": loaded_after_imports, "checks": checks,
                  "answer": answer, "real_now": type(sys.modules["asyncio"]).__name__ == "module",
                  "loop_policy": type(asyncio.events.get_event_loop_policy()).__name__}}))
"""


def _probe(before: str = "") -> dict:
    return json.loads(run_fresh_python(_PROBE.format(before=before)).strip().splitlines()[-1])


def test_structlog_and_apscheduler_load_without_asyncio_and_asyncio_works_when_used() -> None:
    """The imports leave asyncio's event loop unloaded; apscheduler's coroutine check, asyncio.run and a submodule
    import then work on the real asyncio, which replaces the stand-in."""
    seen = _probe()
    assert seen["deferred"] is True and seen["loaded_after_imports"] is False
    assert seen["checks"] == [True, False] and seen["answer"] == 42 and seen["real_now"] is True
    assert seen["loop_policy"].endswith("EventLoopPolicy")


def test_too_late_changes_nothing() -> None:
    """Where asyncio is loaded already, the real module stays."""
    seen = _probe("import asyncio")
    assert seen["deferred"] is False and seen["loaded_after_imports"] is True and seen["real_now"] is True


_RUN = """
import json, sys, types
sys.path.insert(0, sys.argv[1])
seen = {}
fake = types.ModuleType("agent.daemon")
def run_daemon(config_path, host):
    seen["asyncio"] = type(sys.modules.get("asyncio")).__name__
    seen["ssl"] = sys.modules.get("ssl", "absent")
    return 0
fake.run_daemon = run_daemon
sys.modules["agent.daemon"] = fake
from agent.cli import main
main(["run", "--config", "/nonexistent.toml", "--root", "/"], make_host=lambda root: None)
print(json.dumps({"asyncio": seen["asyncio"], "ssl_blocked": seen["ssl"] is None}))
"""


def test_gpuguard_run_defers_asyncio_and_keeps_openssl_out_before_the_daemon_starts() -> None:
    """``gpuguard run`` puts both in place before it imports the daemon (and with it structlog and apscheduler)."""
    seen = json.loads(run_fresh_python(_RUN).strip().splitlines()[-1])
    assert seen == {"asyncio": "DeferredAsyncio", "ssl_blocked": True}



_LOG_RECORD = """
import json, logging, sys
sys.path.insert(0, sys.argv[1])
from agent.daemon_jobs.lazy_asyncio import defer_asyncio
defer_asyncio()
stand_in = sys.modules["asyncio"]
record = logging.LogRecord("resident", logging.INFO, "probe.py", 1, "event", None, None)  # as structlog's import does
loaded = "asyncio.base_events" in sys.modules
async def in_a_task():
    return stand_in.current_task().get_name()  # the stand-in, bound before asyncio loaded, answers from the real one
print(json.dumps({"loaded": loaded, "task_name": getattr(record, "taskName", None),
                  "in_task": stand_in.run(in_a_task())}))
"""


def python_interpreter(version: str) -> str:
    """This interpreter where it is ``version``, else a pyenv one; skipped where there is none (optional)."""
    if "%d.%d" % sys.version_info[:2] == version:
        return sys.executable
    found = sorted((Path.home() / ".pyenv/versions").glob(f"{version}.*/bin/python{version}"))
    if not found:
        pytest.skip(f"no Python {version} interpreter on this machine (optional cross-check, as the other pyenv ones)")
    return str(found[-1])


@pytest.mark.parametrize("version", ["this", "3.12"])
def test_a_log_record_leaves_asyncio_unloaded(version: str) -> None:
    """A ``logging.LogRecord`` (since Python 3.12 it asks asyncio for the current task; Ubuntu 24.04's Python)
    finds no task through the stand-in without loading asyncio, and in a running loop the stand-in names the task."""
    python = sys.executable if version == "this" else python_interpreter(version)
    result = subprocess.run([python, "-I", "-c", _LOG_RECORD, str(REPO)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"loaded": False, "task_name": None,
                                                                   "in_task": "Task-1"}
