"""The dnf checker on generated JSON requests: never a traceback, and a request naming a guarded package that
cannot be fully parsed is always refused (bounded hypothesis run: 300 examples, no deadline)."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path
from typing import Any, Iterator, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.errors import InputFileError
from agent.guard.dnf import check as dnf_check
from agent.guard.dnf.request import parse_request
from agent.guard.hotpath import decision as exits
from agent.policy.load import load_and_compile, write_compiled
from tests.guard.dnf.installroot.harness import TEST_POLICY

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
GUARDED = ["kernel-core", "amdgpu-dkms", "rocm-core"]
CODES = {exits.EXIT_ALLOW, exits.EXIT_REFUSED, exits.EXIT_FAILSAFE_POLICY, exits.EXIT_FAILSAFE_INPUT,
         exits.EXIT_INTERNAL}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("dnffuzz")
    (base / "policy.toml").write_text(TEST_POLICY)
    _, compiled = load_and_compile(str(base / "policy.toml"))
    write_compiled(str(base / "var/lib/gpuguard/policy.compiled.json"), compiled)
    yield base


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2, 3), st.sampled_from(
    ["", "0", "1", "5.14.0", "427.el9", "6.3.0.60300", "1;2", "x86_64", "in", "out", "Upgrade"]))
package = st.fixed_dictionaries(
    {"name": st.sampled_from(GUARDED + ["hello-fake", "vim"])},
    optional={"epoch": scalars, "version": scalars, "release": scalars, "arch": scalars,
              "direction": st.sampled_from(["in", "out", "sideways", None]), "action": scalars})
documents = st.fixed_dictionaries(
    {"format": st.sampled_from([1, 1, 1, 2, "1", None])},
    optional={"tool": st.sampled_from(["dnf", "dnf5", "yum", 3]),
              "command_line": st.one_of(st.none(), st.just("dnf install kernel-core"), st.integers()),
              "installonly": st.one_of(st.lists(st.sampled_from(["kernel-core", 5])), st.just("kernel")),
              "installed": st.one_of(st.lists(package, max_size=3), st.just({})),
              "items": st.one_of(st.lists(package, max_size=4), st.just("rocm-core"))})
requests = st.builds(lambda doc, cut: json.dumps(doc)[:cut], documents, st.integers(min_value=0, max_value=1500))


def check(root: Path, text: str) -> Tuple[int, str]:
    err = io.StringIO()
    code = dnf_check.main(["--root", str(root), "--state-dir", "/fuzz-state"], stdin=io.BytesIO(text.encode()),
                          err=err, now=lambda: NOW)
    return code, err.getvalue()


def _parses(text: str) -> Any:
    try:
        parse_request(text)
    except InputFileError:
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(text=requests)
def test_unparsable_request_naming_a_guarded_package_is_refused(root: Path, text: str) -> None:
    """No traceback, a documented exit code, no unreadable request naming a guarded package gets through."""
    code, out = check(root, text)
    assert "Traceback" not in out and code in CODES, (text, out)
    if not _parses(text) and any(name in text for name in GUARDED):
        assert code == exits.EXIT_FAILSAFE_INPUT, (text, out)
        assert "touches no guarded package" not in out
