"""The policy bundle: one canonical JSON file holding a policy.d, its serial, author, scope and (optionally) matrix
and knowledge tables (``knowledge``: file name -> text, each a table of agent/policy/knowledge.py).

The signature (a detached OpenPGP signature, agent/bundle/verify.py) is over the exact bytes :func:`render_bundle`
writes: sorted keys, no spaces, UTF-8, one trailing newline. :func:`parse_bundle` reads any JSON that validates
(the hub stores and serves the bytes it was given, never a re-rendering), bounded in size, with no key named twice
in any object and no text that UTF-8 cannot encode (a lone surrogate escaped as ``\\ud800``), and refuses anything
else in one line naming the field (``BundleInvalid``, exit 4). The hub parses pushed bundles with the same
function (one home).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Literal, Optional, Tuple

from pydantic import Field, StrictBool, StrictInt, StrictStr, ValidationError, field_validator, model_validator

from agent.errors import InputFileError
from agent.models import FrozenModel, first_validation_problem
from agent.policy.knowledge import FILE_NAMES
from agent.strictjson import parse_json_text
from agent.validation import utc_time
from agent.wire import MAX_STORED_INT

BUNDLE_FORMAT = "gpuguard-policy-bundle/1"
MAX_BUNDLE_BYTES = 4 * 1024 * 1024
MAX_POLICY_FILES = 64
MAX_SELECTORS = 1000
# A serial fits a signed 64-bit integer column (SQLite, PostgreSQL BIGINT).
MAX_SERIAL = MAX_STORED_INT
# The matrix file is never a policy file (agent/policy/load.py skips it in a policy.d).
MATRIX_FILE_NAME = "amd-compat-matrix.toml"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class BundleInvalid(InputFileError):
    """A policy bundle file is not one: too large, not JSON, or a field is wrong (the message names it)."""


def _glob_list(value: Tuple[str, ...]) -> Tuple[str, ...]:
    for item in value:
        if not item or len(item) > 256:
            raise ValueError("each entry is a non-empty string of at most 256 characters")
    return value


class BundleScope(FrozenModel):
    """Which hosts a bundle is for: ``all``, or every given selector matches (agent/bundle/scope.py)."""

    all: StrictBool = False
    host_ids: Tuple[StrictStr, ...] = Field(default=(), max_length=MAX_SELECTORS)
    labels: Dict[StrictStr, StrictStr] = Field(default_factory=dict, max_length=MAX_SELECTORS)
    gpu_models: Tuple[StrictStr, ...] = Field(default=(), max_length=MAX_SELECTORS)
    os: Tuple[StrictStr, ...] = Field(default=(), max_length=MAX_SELECTORS)
    pairings: Tuple[StrictStr, ...] = Field(default=(), max_length=MAX_SELECTORS)

    _check_lists = field_validator("host_ids", "gpu_models", "os", "pairings")(_glob_list)

    @field_validator("labels")
    @classmethod
    def _check_labels(cls, value: Dict[str, str]) -> Dict[str, str]:
        for key, item in value.items():
            if not key or len(key) > 256 or len(item) > 256:
                raise ValueError("label names are non-empty, names and values at most 256 characters")
        return value

    @model_validator(mode="after")
    def _all_or_selectors(self) -> "BundleScope":
        selectors = (self.host_ids, self.labels, self.gpu_models, self.os, self.pairings)
        if self.all and any(selectors):
            raise ValueError("all = true takes no selectors (host_ids, labels, gpu_models, os, pairings)")
        if not self.all and not any(selectors):
            raise ValueError("no hosts: give all = true or at least one selector")
        return self


class PolicyBundle(FrozenModel):
    """One policy bundle, as signed (``render_bundle``) and as read back (``parse_bundle``)."""

    format: Literal["gpuguard-policy-bundle/1"]
    serial: StrictInt = Field(ge=1, le=MAX_SERIAL)
    created_at: StrictStr
    created_by: StrictStr = Field(min_length=1, max_length=256)
    matrix_version: Optional[StrictStr] = Field(default=None, min_length=1, max_length=256)
    scope: BundleScope
    policy_files: Dict[StrictStr, StrictStr] = Field(min_length=1, max_length=MAX_POLICY_FILES)
    matrix: Optional[StrictStr] = Field(default=None, min_length=1)
    # When the bundle stops being good (required under a root, agent/bundle/roles.py); None: never (no root).
    expires: Optional[StrictStr] = None
    # gpuguard's compatibility tables, newer than the package's (file name -> its TOML text); None: none carried.
    knowledge: Optional[Dict[StrictStr, StrictStr]] = Field(default=None, min_length=1,
                                                            max_length=len(FILE_NAMES))

    @field_validator("created_at", "expires")
    @classmethod
    def _utc_time(cls, value: Optional[str]) -> Optional[str]:
        return None if value is None else utc_time(value)

    @field_validator("knowledge")
    @classmethod
    def _knowledge_names(cls, value: Optional[Dict[str, str]]) -> Optional[Dict[str, str]]:
        for name in value or {}:
            if name not in FILE_NAMES:
                raise ValueError(f"{name!r} is not a knowledge file gpuguard reads ({', '.join(FILE_NAMES)})")
        return value

    @field_validator("policy_files")
    @classmethod
    def _file_names(cls, value: Dict[str, str]) -> Dict[str, str]:
        for name in value:
            if (not name.endswith(".toml") or name.startswith(".") or len(name) > 128
                    or not set(name) <= _NAME_CHARS or name == MATRIX_FILE_NAME):
                raise ValueError(f"{name!r} is not a policy file name (letters, digits, '.', '_', '-', ending in "
                                 f".toml, not {MATRIX_FILE_NAME})")
        return value


def unencodable_text(value: Any, where: str = "") -> Optional[str]:
    """Where ``value`` (decoded JSON) holds text that cannot be written as UTF-8 (a lone surrogate such as
    ``\\ud800``, which JSON's escapes can carry), in one line naming the field; None when all of it can."""
    stack: List[Tuple[str, Any]] = [(where, value)]
    while stack:
        at, item = stack.pop()
        texts: List[Tuple[str, Any]] = []
        if isinstance(item, dict):
            for key, child in item.items():
                texts.append((f"{at} (key)" if at else "(key)", key))
                stack.append((f"{at} -> {key}" if at else str(key), child))
        elif isinstance(item, list):
            stack.extend((f"{at} -> {index}", child) for index, child in enumerate(item, 1))
        else:
            texts.append((at, item))
        for name, text in texts:
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as exc:
                    shown = name.encode("utf-8", "backslashreplace").decode("ascii", "replace")
                    return (f"{shown or 'policy bundle'}: text holds U+{ord(text[exc.start]):04X} (a lone surrogate), "
                            f"which UTF-8 cannot encode")
    return None


def canonical_bytes(data: Dict[str, Any]) -> bytes:
    """The canonical bytes of a signed document (a bundle, a deny list): sorted keys, no spaces, UTF-8, one
    trailing newline."""
    return (json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")


def render_bundle(bundle: PolicyBundle) -> bytes:
    """The canonical bytes of a bundle, the ones a signature is made over."""
    data = bundle.model_dump(mode="json")
    for optional in ("expires", "knowledge"):  # a bundle without one renders as it did before the field existed
        if data[optional] is None:
            del data[optional]
    return canonical_bytes(data)


def parse_bundle(data: bytes, source: str) -> PolicyBundle:
    """A bundle read from ``data``; BundleInvalid (one line naming ``source`` and the field) otherwise."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleInvalid(source, f"policy bundle is {len(data)} bytes, more than the {MAX_BUNDLE_BYTES} allowed")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BundleInvalid(source, f"policy bundle is not UTF-8 (byte {exc.start})") from None
    try:
        value = parse_json_text(source, text, unique_keys=True)
    except InputFileError as exc:
        raise BundleInvalid(source, f"policy bundle is {exc.reason}") from None
    if not isinstance(value, dict):
        raise BundleInvalid(source, "policy bundle is not a JSON object")
    problem = unencodable_text(value)
    if problem is not None:
        raise BundleInvalid(source, problem)
    if value.get("format") != BUNDLE_FORMAT:
        raise BundleInvalid(source, f"format: {value.get('format')!r} is not {BUNDLE_FORMAT!r}")
    try:
        return PolicyBundle.model_validate(value)
    except ValidationError as exc:
        raise BundleInvalid(source, first_validation_problem(exc)) from None
