"""Fuzz the hub over its own OpenAPI spec (schemathesis), against a real hub process on 127.0.0.1.

Every operation gets generated valid and invalid requests (bounded: examples per operation and a deadline); the
hub must never answer 5xx, every status must be documented, and every body must match its documented schema.
Positive-data acceptance is not checked: the hub refuses a few values the schema allows (NUL characters,
sequences past 2**63-1, times without offset) with a documented 422.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from agent.hub.tokens import add_token
from tests.hub.process import HubProcess, write_config

pytestmark = pytest.mark.slow  # real servers or processes per test: left out of `make test-fast`

FUZZ_HOST = "fuzz-host"
MAX_EXAMPLES = 60
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    root = tmp_path_factory.mktemp("fuzz-hub")
    tokens_file = root / "tokens.json"
    host_token = add_token(str(tokens_file), "host", FUZZ_HOST)
    reader_token = add_token(str(tokens_file), "reader", "fuzzer")
    admin_token = add_token(str(tokens_file), "admin", "fuzz-admin")
    config = write_config(Path(root / "hub.toml"), listen_port=0, database_url=f"sqlite:///{root}/hub.db",
                          tokens_file=tokens_file, max_body_bytes=256 * 1024, log_level="warning")
    process = HubProcess(config)
    # log_level warning hides hub_listening; the fixture reads the port from the info line, so keep info here.
    write_config(config, listen_port=0, database_url=f"sqlite:///{root}/hub.db", tokens_file=tokens_file,
                 max_body_bytes=256 * 1024)
    process.start()
    yield {"process": process, "host_token": host_token, "reader_token": reader_token, "admin_token": admin_token}
    assert process.stop() == 0, process.log_text()


def _spec() -> Dict[str, Any]:
    """The spec the hub serves at /openapi.json, built without starting anything (the test compares both)."""
    from agent.hub.app import create_app
    from agent.hub.settings import HubSettings
    from agent.hub.store import SQLiteStore
    from agent.hub.tokens import TokenRegistry

    app = create_app(HubSettings(), SQLiteStore("/nonexistent/hub.db"), tokens=TokenRegistry.of_entries([]))
    return app.openapi()


# Built at collection time: schemathesis' lazy fixture loader does not work with this pytest (9.x).
schema = schemathesis.openapi.from_dict(_spec())
# The coverage phase ignores max_examples (it enumerates every boundary the schema defines, which for EventBatch
# takes minutes on some schemathesis versions); examples and fuzzing stay bounded by MAX_EXAMPLES.
schema.config.phases.update(phases=["examples", "fuzzing"])


def test_the_served_spec_is_the_fuzzed_spec(fuzz_hub: Dict[str, Any]) -> None:
    """The OpenAPI spec the running hub serves is the one the fuzzer was built from."""
    import requests

    served = requests.get(f"{fuzz_hub['process'].url}/openapi.json", timeout=10).json()
    assert served == _spec()


_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_HEADER_VALUE = re.compile(r"^[\x20-\x7e\t]*$")


def _valid_http_headers(headers: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Generated headers that HTTP allows; the rest would be refused by the HTTP parser (a plain-text 400 from
    uvicorn, before the hub sees the request), which tests the parser, not the API."""
    if headers is None:
        return None
    return {k: v for k, v in headers.items()
            if _HEADER_NAME.match(str(k)) and _HEADER_VALUE.match(str(v))}


def _own_host(body: Any) -> None:
    """Point generated events at the token's host, so valid batches reach the store instead of stopping at 403."""
    if isinstance(body, dict) and isinstance(body.get("events"), list):
        for item in body["events"]:
            if isinstance(item, dict) and "host_id" in item:
                item["host_id"] = FUZZ_HOST


def _token_for(method: str, path: str, fuzz_hub: Dict[str, Any]) -> str:
    """The token that may call the operation, so generated requests get past 401/403 to the checks behind them:
    the admin's for policy changes, the host's for its events and its bundle, the reader's for the rest."""
    if method == "POST" and path.startswith("/v1/policy/"):
        return str(fuzz_hub["admin_token"])
    if method == "POST" or path == "/v1/policy/bundle":
        return str(fuzz_hub["host_token"])
    return str(fuzz_hub["reader_token"])


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.timeout(300)
def test_no_5xx_and_every_answer_as_documented(case: Any, fuzz_hub: Dict[str, Any]) -> None:
    """Valid and invalid requests to every operation: documented status, content type and body."""
    token = _token_for(case.method.upper(), case.path, fuzz_hub)
    _own_host(case.body)
    case.headers = _valid_http_headers(case.headers)
    case.call_and_validate(base_url=fuzz_hub["process"].url, headers={"Authorization": f"Bearer {token}"},
                           checks=CHECKS, timeout=10)
