"""Several hubs over one PostgreSQL: started at the same instant on a fresh database they all serve; a worker that
cannot start makes the hub exit non-zero with a reason instead of leaving a socket nobody answers."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import requests

from agent.hub.store import PostgresStore
from agent.hub.tokens import add_token
from tests.hub.factories import batch_json, event
from tests.hub.process import REPO, HubProcess, wait_until, write_config

pytestmark = pytest.mark.slow  # real servers and processes

TIMEOUT_SECONDS = 10
RACERS = 8


def _open_at_once(url: str, barrier: "multiprocessing.synchronize.Barrier", results: "multiprocessing.Queue") -> None:
    store = PostgresStore(url)
    barrier.wait(30)
    try:
        store.open()
        results.put("ok")
    except Exception as exc:  # noqa: BLE001 - the parent asserts on what came back
        results.put(f"{type(exc).__name__}: {exc}")
    finally:
        store.close()


def test_stores_opening_a_fresh_database_at_the_same_instant_all_succeed(postgres_url: str) -> None:
    """8 processes released by one barrier create the schema together: every open succeeds (no UniqueViolation)."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(RACERS)
    results = context.Queue()
    processes = [context.Process(target=_open_at_once, args=(postgres_url, barrier, results)) for _ in range(RACERS)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    outcomes = [results.get(timeout=5) for _ in processes]
    assert outcomes == ["ok"] * RACERS


def _hub_config(tmp_path: Path, name: str, url: str, tokens_file: Path, workers: int) -> Path:
    return write_config(tmp_path / f"{name}.toml", listen_host="127.0.0.1", listen_port=0, database_url=url,
                        tokens_file=tokens_file, tokens_reload_seconds=0, shutdown_timeout_seconds=5,
                        workers=workers)


def _post(url: str, token: str, host_id: str) -> int:
    answer = requests.post(f"{url}/v1/events", data=batch_json([event(host_id)]), timeout=TIMEOUT_SECONDS,
                           headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    return answer.status_code


def test_hubs_and_workers_started_together_on_a_fresh_database_all_serve(tmp_path: Path, postgres_url: str) -> None:
    """Three hubs (one with 3 workers: 5 processes) start at once on an empty database; each stores and answers."""
    tokens_file = tmp_path / "tokens.json"
    tokens = {host: add_token(str(tokens_file), "host", host) for host in ("h1", "h2", "h3")}
    hubs = [HubProcess(_hub_config(tmp_path, f"hub{i}", postgres_url, tokens_file, workers))
            for i, workers in enumerate((1, 1, 3))]
    failures: Dict[int, str] = {}

    def start(index: int) -> None:
        try:
            hubs[index].start()
        except RuntimeError as exc:
            failures[index] = str(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(len(hubs))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert failures == {}
        statuses: List[int] = []
        for hub, host in zip(hubs, tokens):
            assert requests.get(f"{hub.url}/healthz", timeout=TIMEOUT_SECONDS).status_code == 200
            statuses += [_post(hub.url, tokens[host], host) for _ in range(12)]  # several workers take turns
        assert statuses == [200] * 36
        assert hubs[2].events("hub_listening")[0]["workers"] == 3
        assert len({r["pid"] for r in hubs[2].events("hub_worker_started")}) == 3
        import psycopg

        with psycopg.connect(postgres_url, autocommit=True) as conn:
            row = conn.execute("SELECT COUNT(*), COUNT(DISTINCT host_id) FROM events").fetchone()
        assert row == (36, 3)
    finally:
        codes = [hub.stop() for hub in hubs]
    assert codes == [0, 0, 0]


def _serve_briefly(config: Path, timeout_seconds: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent", "hub", "serve", "--config", str(config)], cwd=str(REPO),
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=timeout_seconds)


def test_a_worker_that_cannot_open_the_store_stops_the_hub_with_a_reason(tmp_path: Path, postgres_url: str) -> None:
    """A database made by a newer hub: every worker fails at start; the hub exits 10 and never says it listens."""
    import psycopg

    store = PostgresStore(postgres_url)
    store.open()
    store.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE hub_meta SET value = '99' WHERE key = 'schema_version'")
    result = _serve_briefly(_hub_config(tmp_path, "hub", postgres_url, tmp_path / "tokens.json", 2))
    assert result.returncode == 10, result.stderr[-2000:]
    assert '"hub_listening"' not in result.stderr
    assert "database schema version 99" in result.stderr
    last: Optional[str] = result.stderr.strip().splitlines()[-1]
    assert last is not None and "hub did not start" in last and "Traceback" not in result.stderr


def test_a_single_process_hub_that_cannot_open_the_store_exits_10(tmp_path: Path) -> None:
    """workers = 1 as well: a store that cannot be opened is exit 10 with one line, not a traceback and exit 3."""
    (tmp_path / "db").write_text("")
    (tmp_path / "db").chmod(0o000)
    config = write_config(tmp_path / "hub.toml", listen_host="127.0.0.1", listen_port=0,
                          database_url=f"sqlite:///{tmp_path}/db/hub.db", tokens_file=tmp_path / "tokens.json")
    result = _serve_briefly(config)
    assert result.returncode == 10, result.stderr[-2000:]
    assert "hub store open failed" in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr


def test_a_worker_killed_later_is_replaced_and_the_hub_keeps_serving(tmp_path: Path) -> None:
    """SIGKILL one of two workers (SQLite here): the supervisor starts another, requests keep being answered, and
    SIGTERM still stops everything with exit 0."""
    import os
    import signal

    tokens_file = tmp_path / "tokens.json"
    token = add_token(str(tokens_file), "host", "h1")
    hub = HubProcess(_hub_config(tmp_path, "hub", f"sqlite:///{tmp_path}/hub.db", tokens_file, 2)).start()
    try:
        first = [r["pid"] for r in hub.events("hub_worker_started")]
        assert len(first) == 2
        os.kill(first[0], signal.SIGKILL)
        assert wait_until(lambda: hub.events("hub_worker_restarted")), hub.log_text()
        replacement = [r["pid"] for r in hub.events("hub_worker_started")][-1]
        assert replacement not in first
        assert [_post(hub.url, token, "h1") for _ in range(10)] == [200] * 10
    finally:
        code = hub.stop()
    assert code == 0, hub.log_text()


def test_sigterm_to_the_whole_group_stops_every_worker_gracefully(tmp_path: Path) -> None:
    """systemd's KillMode=control-group signals the main process and every worker at once, and the main process
    passes it on: each worker sees the echo within a second and still shuts down gracefully (its lifespan runs:
    hub_stopped), and the hub exits 0."""
    import os
    import signal

    hub = HubProcess(_hub_config(tmp_path, "hub", f"sqlite:///{tmp_path}/hub.db", tmp_path / "tokens.json", 2))
    hub.start()
    workers = [r["pid"] for r in hub.events("hub_worker_started")]
    assert hub.process is not None
    for pid in [hub.process.pid, *workers]:
        os.kill(pid, signal.SIGTERM)
    assert hub.stop() == 0, hub.log_text()
    assert len(hub.events("hub_stopped")) == 2, hub.log_text()
