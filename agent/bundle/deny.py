"""Known-bad versions: a signed deny list that travels outside staged rollouts (issue 43).

A deny list (``deny.json``, format ``gpuguard-deny/1``) is canonical JSON with its own ``serial`` and a list of
entries, each a package glob list, the versions it denies (a version spec, agent/policy/spec.py: ``= 580.95.05-1``,
``>= 1.2, << 1.4``), the reason, the source URL and the date it was added. It is signed (gpg detached signatures,
several in one ``.sig``, checked by gpgv) by a threshold of one policy role of the root in force whose scope is
``all``: a deny list speaks for every host, so only the keys that may sign policy for the whole fleet may sign one.
The hub's online freshness key may not: a key that sits on a server and signs every few hours must not be able to
refuse every driver version on every host (that is policy, and policy needs the offline keys); and the hub itself
only serves the file (``[hub] root_dir``'s ``deny.json``), so a hub broken into can withhold a newer list but never
forge or replay an older one: a host takes a list only above the serial in force (the same serial with the same
bytes is a no-op; with other bytes, or a lower serial, is refused as ``rollback``).

The daemon asks for it at every policy fetch, after the roots and the freshness statement (agent/bundle/channel.py),
whatever a rollout holds back: every host takes a new list at its next fetch. Once taken, its entries become the
``denied`` section of the compiled policy the hook judges (agent/policy/families/denied.py), and ``gpuguard pin
apply`` renders them as native pins. Every refusal is a kind of agent/wire.py's REFUSAL_KINDS. :func:`parse_deny`,
:func:`render_deny`, :func:`judge_deny` and :func:`compiled_entries` are pure.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, List, Literal, Optional, Tuple, Union

from pydantic import Field, StrictInt, StrictStr, field_validator, model_validator

from agent.bundle.format import MAX_SERIAL, canonical_bytes
from agent.bundle.roles import (
    KIND_EXPIRED,
    KIND_ROLLBACK,
    KIND_SCOPE,
    KIND_SIGNATURE,
    KIND_THRESHOLD,
    RootMetadata,
    good_signers,
    parse_signed_document,
)
from agent.errors import BundleRefused, InputFileError
from agent.files import FileMissing, read_bytes_bounded, write_bytes_atomically
from agent.models import FrozenModel
from agent.validation import iso_day, utc_time

if TYPE_CHECKING:  # pragma: no cover
    from agent.host import Host
    from agent.policy.compiled import CompiledPolicy
    from agent.statepaths import StatePaths

DENY_FORMAT = "gpuguard-deny/1"
MAX_DENY_BYTES = 1024 * 1024
MAX_DENY_ENTRIES = 1000
MAX_PUBLISHED = 10_000
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class DenyEntry(FrozenModel):
    """One known-bad version: which packages, which versions, why, where that is said, and since when."""

    id: StrictStr = Field(min_length=1, max_length=64)
    packages: Tuple[StrictStr, ...] = Field(min_length=1, max_length=64)
    versions: Union[StrictStr, Tuple[StrictStr, ...]]
    reason: StrictStr = Field(min_length=1, max_length=500)
    source_url: StrictStr = Field(min_length=1, max_length=500)
    added: StrictStr

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not set(value) <= _ID_CHARS:
            raise ValueError(f"{value!r} is not an entry id (letters, digits, '.', '_', '-')")
        return value

    @field_validator("packages")
    @classmethod
    def _globs(cls, value: Tuple[str, ...]) -> Tuple[str, ...]:
        for item in value:
            if not item or len(item) > 256 or any(ch.isspace() for ch in item):
                raise ValueError("each package is a glob of 1 to 256 characters without spaces")
        return value

    @field_validator("versions")
    @classmethod
    def _spec(cls, value: Union[str, Tuple[str, ...]]) -> Union[str, Tuple[str, ...]]:
        from agent.policy.spec import package_spec_errors

        problems = package_spec_errors(value if isinstance(value, str) else list(value))
        if problems:
            raise ValueError("; ".join(problems))
        if value in ("any", ("any",)):
            raise ValueError("'any' would deny every version: name the known-bad ones")
        return value

    @field_validator("source_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("https://", "http://")) or any(ch.isspace() for ch in value):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value

    _added = field_validator("added")(iso_day)


class Published(FrozenModel):
    """When one package version became public: the date bake time counts from (agent/policy/families/bake.py)."""

    package: StrictStr = Field(min_length=1, max_length=256)
    version: StrictStr = Field(min_length=1, max_length=256)
    date: StrictStr

    _date = field_validator("date")(iso_day)


class DenyList(FrozenModel):
    """One deny list (see the module's docstring); ``published`` (optional) dates versions for bake time."""

    format: Literal["gpuguard-deny/1"]
    serial: StrictInt = Field(ge=1, le=MAX_SERIAL)
    issued_at: StrictStr
    entries: Tuple[DenyEntry, ...] = Field(default=(), max_length=MAX_DENY_ENTRIES)
    published: Tuple[Published, ...] = Field(default=(), max_length=MAX_PUBLISHED)

    _issued_at = field_validator("issued_at")(utc_time)

    @model_validator(mode="after")
    def _distinct_ids(self) -> "DenyList":
        ids = [entry.id for entry in self.entries]
        if len(set(ids)) != len(ids):
            raise ValueError("entries: an id is used twice")
        return self


def render_deny(deny: DenyList) -> bytes:
    """The canonical bytes of a deny list, the ones its signatures are made over."""
    data = deny.model_dump(mode="json")
    if not data["published"]:  # a list without dates renders as it did before the field existed
        del data["published"]
    return canonical_bytes(data)


def parse_deny(data: bytes, source: str) -> DenyList:
    """A deny list read from ``data`` (strict JSON, no duplicate keys, encodable text: roles.py's
    :func:`parse_signed_document`); BundleRefused of kind format otherwise."""
    return parse_signed_document(data, source, "deny list", DENY_FORMAT, DenyList, MAX_DENY_BYTES)


def judge_deny(root: RootMetadata, signers: FrozenSet[str], now: dt.datetime, source: str) -> str:
    """The name of the fleet-wide policy role (scope ``all``) whose threshold ``signers`` meet (pure); BundleRefused
    otherwise, of kind expired (the root), scope (only a role for some hosts met its threshold), threshold (too
    few keys of a fleet-wide role) or signature (no policy key signed)."""
    if now >= root.expires_at:
        raise BundleRefused(source, f"root version {root.version} expired at {root.expires}", kind=KIND_EXPIRED)
    fleet = [role for role in root.policy if role.scope.all]
    for role in fleet:
        if role.met_by(signers) >= role.threshold:
            return role.name
    partial = next((role for role in root.policy if not role.scope.all and role.met_by(signers) >= role.threshold),
                   None)
    if partial is not None:
        raise BundleRefused(source, f"signed by policy role {partial.name!r}, whose scope is not all hosts (a deny "
                                    f"list speaks for the whole fleet)", kind=KIND_SCOPE)
    short = next((role for role in fleet if role.met_by(signers)), None)
    if short is not None:
        raise BundleRefused(source, f"{short.met_by(signers)} of the {short.threshold} signatures policy role "
                                    f"{short.name!r} needs", kind=KIND_THRESHOLD)
    raise BundleRefused(source, f"no valid signature by a fleet-wide policy key of root version {root.version}",
                        kind=KIND_SIGNATURE)


def compiled_entries(deny: DenyList) -> List[Dict[str, Any]]:
    """The ``denied`` section of a compiled policy: each entry as plain data, with the list's serial."""
    out = []
    for entry in deny.entries:
        item = entry.model_dump(mode="json")
        item["versions"] = item["versions"] if isinstance(item["versions"], str) else list(item["versions"])
        item["packages"] = list(item["packages"])
        item["serial"] = deny.serial
        out.append(item)
    return out


def deny_in_force(host: "Host", paths: "StatePaths") -> Optional[DenyList]:
    """The deny list in force (verified when it was taken), None when there is none; InputFileError when the file
    in place is damaged."""
    path = host.path(paths.policy_deny)
    try:
        data = read_bytes_bounded(str(path), MAX_DENY_BYTES)
    except FileMissing:
        return None
    try:
        return parse_deny(data, str(path))
    except BundleRefused as exc:
        raise InputFileError(str(path), exc.reason) from None


def with_denied(compiled: "CompiledPolicy", host: "Host", paths: "StatePaths") -> "CompiledPolicy":
    """``compiled`` with the deny list in force as its ``denied`` section: what every writer of the compiled policy
    writes, so a recompile never drops a known-bad version. InputFileError when the deny list in place is damaged."""
    from agent.policy.compiled import check_compiled

    deny = deny_in_force(host, paths)
    data = dict(compiled.data)
    data["denied"] = compiled_entries(deny) if deny is not None else []
    # A denied package is guarded: the fail-safe and the known-good set cover it like the policy's own.
    if isinstance(data.get("bake"), dict):  # bake time counts from the dates the list carries
        data["bake"] = {**data["bake"], "published": [[p.package, p.version, p.date]
                                                      for p in (deny.published if deny is not None else ())]}
    denied_globs = [pattern for entry in data["denied"] for pattern in entry["packages"]]
    data["guarded"] = list(dict.fromkeys([*(data.get("guarded") or []), *denied_globs]))
    return check_compiled(json.loads(json.dumps(data)), compiled.path)


def take_deny(host: "Host", root: RootMetadata, paths: "StatePaths", data: bytes, signature: bytes,
              now: dt.datetime, source: str) -> Tuple[DenyList, bool]:
    """Check a deny list (a threshold of a fleet-wide policy role, a serial above the one in force) and put it in
    force: the files, then the compiled policy's ``denied`` section when a compiled policy exists. (the list, whether
    it was new); BundleRefused with its kind otherwise, and nothing changes then."""
    deny = parse_deny(data, source)
    with tempfile.TemporaryDirectory(prefix="gpuguard-deny-") as work:
        data_path, signature_path = Path(work) / "deny.json", Path(work) / "deny.json.sig"
        write_bytes_atomically(str(data_path), data)
        write_bytes_atomically(str(signature_path), signature)
        signers = good_signers(host, data_path, signature_path, root.keyring_bytes(), source)
    judge_deny(root, signers, now, source)
    try:
        current = deny_in_force(host, paths)
    except InputFileError:
        current = None  # a damaged file in place: the verified list replaces it
    if current is not None:
        placed = read_bytes_bounded(str(host.path(paths.policy_deny)), MAX_DENY_BYTES)
        if deny.serial == current.serial and hashlib.sha256(placed).digest() == hashlib.sha256(data).digest():
            return current, False
        if deny.serial <= current.serial:
            raise BundleRefused(source, f"deny list serial {deny.serial} is not above serial {current.serial} in "
                                        f"force", KIND_ROLLBACK, deny.serial)
    target = host.path(paths.policy_deny)
    os.makedirs(target.parent, exist_ok=True)
    write_bytes_atomically(str(target) + ".sig", signature)
    write_bytes_atomically(str(target), data)
    _recompile(host, paths)
    return deny, True


def _recompile(host: "Host", paths: "StatePaths") -> None:
    """Put the deny list in force into the compiled policy in place (none in place: the next compile takes it)."""
    from agent.policy.compiled import read_compiled
    from agent.policy.load import write_compiled

    path = str(host.path(paths.compiled_policy))
    if not os.path.exists(path):
        return
    write_compiled(path, with_denied(read_compiled(path), host, paths))
