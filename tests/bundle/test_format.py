"""The policy bundle format: canonical rendering, a bounded parse, one line naming the field for anything else."""

from __future__ import annotations

import json
from typing import Any, Dict

import pytest

from agent.bundle.format import (
    BUNDLE_FORMAT,
    MAX_BUNDLE_BYTES,
    BundleInvalid,
    BundleScope,
    PolicyBundle,
    parse_bundle,
    render_bundle,
)
from agent.errors import InputFileError


def bundle_data(**changes: Any) -> Dict[str, Any]:
    """The contract's example bundle as plain data, with ``changes`` applied."""
    data: Dict[str, Any] = {
        "format": BUNDLE_FORMAT, "serial": 42, "created_at": "2026-12-04T23:00:00Z",
        "created_by": "ops@example.com", "matrix_version": "2026-12-03",
        "scope": {"all": False, "host_ids": ["h1"], "labels": {"rack": "a7"}, "gpu_models": ["*H200*"],
                  "os": ["ubuntu-24.04"], "pairings": ["nvidia 580.*"]},
        "policy_files": {"10-pairing.toml": "[policy]\nname = \"x\"\n"}, "matrix": None,
    }
    data.update(changes)
    return data


def test_render_is_canonical_and_parses_back_equal() -> None:
    """Sorted keys, no spaces, UTF-8, one trailing newline; parsing the bytes gives the same bundle."""
    bundle = PolicyBundle.model_validate(bundle_data(created_by="Jörg <ops@example.com>"))
    data = render_bundle(bundle)
    assert data.endswith(b"}\n") and data.count(b"\n") == 1 and b": " not in data and b", " not in data
    assert "Jörg".encode("utf-8") in data
    assert list(json.loads(data)) == sorted(json.loads(data))
    assert parse_bundle(data, "b.json") == bundle


def test_render_does_not_depend_on_input_order_or_whitespace() -> None:
    """Two spellings of the same bundle render to the same bytes, so a signature covers the content."""
    data = bundle_data()
    shuffled = json.dumps(dict(reversed(list(data.items()))), indent=4).encode()
    assert render_bundle(parse_bundle(shuffled, "a")) == render_bundle(PolicyBundle.model_validate(data))


def test_an_all_scope_renders_its_empty_selectors() -> None:
    """A bundle for every host is ``all: true`` with empty selectors, and parses back."""
    bundle = PolicyBundle.model_validate(bundle_data(scope={"all": True}))
    assert json.loads(render_bundle(bundle))["scope"] == {"all": True, "host_ids": [], "labels": {},
                                                          "gpu_models": [], "os": [], "pairings": []}
    assert bundle.scope == BundleScope(all=True)


@pytest.mark.parametrize(("changes", "wanted"), [
    ({"serial": 0}, "serial: Input should be greater than or equal to 1"),
    ({"serial": "42"}, "serial: Input should be a valid integer"),
    ({"serial": True}, "serial: Input should be a valid integer"),
    ({"serial": 2**63}, "serial: Input should be less than or equal to"),
    ({"format": "gpuguard-policy-bundle/2"}, "format: 'gpuguard-policy-bundle/2' is not"),
    ({"created_at": "2026-12-04 23:00"}, "created_at: '2026-12-04 23:00' is not a UTC time"),
    ({"created_by": ""}, "created_by: String should have at least 1 character"),
    ({"policy_files": {}}, "policy_files: Dictionary should have at least 1 item"),
    ({"policy_files": {"../x.toml": "a"}}, "policy_files: '../x.toml' is not a policy file name"),
    ({"policy_files": {"amd-compat-matrix.toml": "a"}}, "policy_files: 'amd-compat-matrix.toml' is not a policy"),
    ({"policy_files": {"a.toml": 1}}, "policy_files -> a.toml: Input should be a valid string"),
    ({"scope": {"all": False}}, "scope: no hosts: give all = true or at least one selector"),
    ({"scope": {"all": True, "host_ids": ["h1"]}}, "scope: all = true takes no selectors"),
    ({"scope": {"all": True, "hosts": ["h1"]}}, "scope -> hosts: Extra inputs are not permitted"),
    ({"scope": {"host_ids": [""]}}, "scope -> host_ids: each entry is a non-empty string"),
    ({"extra": 1}, "extra: Extra inputs are not permitted"),
    ({"matrix": ""}, "matrix: String should have at least 1 character"),
])
def test_a_wrong_field_is_one_line_naming_it(changes: Dict[str, Any], wanted: str) -> None:
    """Each wrong field is refused as BundleInvalid (exit 4), one line starting with the source and the field."""
    with pytest.raises(BundleInvalid) as caught:
        parse_bundle(json.dumps(bundle_data(**changes)).encode(), "b.json")
    message = str(caught.value)
    assert message.startswith("b.json: ") and wanted in message and "\n" not in message
    assert isinstance(caught.value, InputFileError) and caught.value.exit_code == 4


@pytest.mark.parametrize(("data", "wanted"), [
    (b"\xff\xfe", "not UTF-8"),
    (b"{\"format\": ", "not valid JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b"{\"serial\": NaN}", "not valid JSON"),
    (b"[" * 100 + b"]" * 100, "nested deeper"),
])
def test_what_is_not_a_bundle_is_one_line(data: bytes, wanted: str) -> None:
    """Bytes that are not a JSON object are refused in one line, never a traceback."""
    with pytest.raises(BundleInvalid, match=wanted) as caught:
        parse_bundle(data, "b.json")
    assert "\n" not in str(caught.value)


def test_the_size_is_capped_before_anything_is_decoded() -> None:
    """A bundle over 4 MiB is refused by its size alone."""
    with pytest.raises(BundleInvalid, match="more than the 4194304 allowed"):
        parse_bundle(b" " * (MAX_BUNDLE_BYTES + 1), "b.json")
    assert MAX_BUNDLE_BYTES == 4 * 1024 * 1024
