"""Hub fixtures: a tokens file, settings over SQLite in tmp_path, a TestClient running the app's lifespan, and a
throwaway PostgreSQL server (session-wide; in CI it must start, locally it may be skipped with the reason)."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import warnings
from pathlib import Path
from typing import Dict, Iterator, NoReturn, Optional

import pytest

from agent.hub.settings import HubSettings
from agent.hub.tokens import add_token
from tests import needs
from tests.hub.postgres import PostgresServer, PostgresUnavailable
from tests.hub.signing import keys_dir

HOSTS = ("host-a", "host-b", "host-c")
READER = "ops"
ADMIN = "release-admin"
_db_numbers = itertools.count(1)


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    return tmp_path / "hub-tokens.json"


@pytest.fixture
def tokens(tokens_file: Path) -> Dict[str, str]:
    """A host token per HOSTS entry and a reader token under READER."""
    made = {host: add_token(str(tokens_file), "host", host) for host in HOSTS}
    made[READER] = add_token(str(tokens_file), "reader", READER)
    return made


@pytest.fixture
def admin_token(tokens_file: Path, tokens: Dict[str, str]) -> str:
    """An admin token under ADMIN, in the same tokens file as ``tokens``."""
    return add_token(str(tokens_file), "admin", ADMIN)


def bearer(token: str) -> Dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def settings(tmp_path: Path, tokens_file: Path, tokens: Dict[str, str]) -> HubSettings:
    return HubSettings(database_url=f"sqlite:///{tmp_path}/hub.db", tokens_file=str(tokens_file),
                       max_body_bytes=64 * 1024, tokens_reload_seconds=0, policy_keys_dir=keys_dir())


class HubClock:
    """The hub's clock in a test: real time until the test sets ``at`` (then that time, e.g. when events arrive)."""

    def __init__(self) -> None:
        self.at: Optional[dt.datetime] = None

    def __call__(self) -> dt.datetime:
        return self.at or dt.datetime.now(dt.timezone.utc)


@pytest.fixture
def hub_clock() -> HubClock:
    return HubClock()


@pytest.fixture(params=["fast-ingest", "routed-ingest"])
def client(request: pytest.FixtureRequest, settings: HubSettings, hub_clock: HubClock) -> Iterator["object"]:
    """A TestClient over the app with SQLite in tmp_path, on ``hub_clock``; the lifespan (store, writer) runs for the
    test.

    Every test runs twice: POST /v1/events by the direct ASGI path and by FastAPI's routing; answers must agree.
    """
    from fastapi.testclient import TestClient

    from agent.hub.app import create_app
    from agent.hub.store import make_store

    app = create_app(settings, make_store(settings.database_url), clock=hub_clock,
                     fast_ingest=request.param == "fast-ingest")
    with TestClient(app) as test_client:
        yield test_client


def _unavailable(reason: str) -> NoReturn:
    needs.unavailable("PostgreSQL hub tests", reason)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer()
        server.start()
    except (PostgresUnavailable, OSError, KeyError) as exc:  # KeyError: no 'nobody' user to run it as
        _unavailable(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database on the session's server."""
    name = f"hub_test_{os.getpid()}_{next(_db_numbers)}"
    url = postgres_server.create_database(name)
    yield url
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        postgres_server.drop_database(name)
