"""The hub's freshness statement: a short-lived, signed word of what is newest and what is withdrawn (TUF's
timestamp role).

The hub signs it with its online key (the root's ``freshness`` key set, agent/bundle/roles.py, which may sign
nothing else): ``{"format": "gpuguard-freshness/1", "issued_at", "expires", "newest": [{"serial", "scope"}],
"withdrawn": [serials], "deny_serial": N}``, where ``newest`` is the newest bundle offered to everyone for each
scope, ``withdrawn`` every serial withdrawn and ``deny_serial`` (absent: the hub serves no deny list) the serial of
the deny list the hub serves (agent/bundle/deny.py): a host whose deny list is below it asks for attention until it
takes it, so a hub cannot hold back a newer known-bad list unseen. (``deny_serial`` came after 0.1.0, whose
statements never carried it.) A host takes a statement only with a threshold of freshness signatures, not
expired and not issued before the one it took last; then a withdrawn serial offered is refused (a withdrawal is a
signed fact, not the hub's word), and an expired statement, or one naming a newer serial for this host than the one
in force, is attention: an indefinite freeze (a hub answering 304 forever) becomes visible. :func:`parse_statement`,
:func:`newest_for` and :func:`make_statement` are pure.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Optional, Sequence, Tuple

from pydantic import Field, StrictInt, StrictStr, field_validator, model_validator

from agent.bundle.format import MAX_SERIAL, BundleScope
from agent.bundle.roles import (
    KIND_FRESHNESS,
    KIND_SIGNATURE,
    KIND_THRESHOLD,
    RootMetadata,
    good_signers,
    parse_signed_document,
)
from agent.bundle.scope import ScopeFacts, scope_refusal
from agent.errors import BundleRefused
from agent.files import write_bytes_atomically
from agent.models import FrozenModel
from agent.validation import TIME_FORMAT, parse_time, utc_time

if TYPE_CHECKING:  # pragma: no cover
    from agent.host import Host

FRESHNESS_FORMAT = "gpuguard-freshness/1"
MAX_STATEMENT_BYTES = 1024 * 1024
MAX_WITHDRAWN = 10_000
MAX_NEWEST = 1000
# The longest a statement may live: python-tuf's timestamp default is a day; a week is the outer bound.
MAX_FRESHNESS_HOURS = 7 * 24
DEFAULT_FRESHNESS_HOURS = 24


class NewestBundle(FrozenModel):
    """The newest bundle offered to everyone for one scope."""

    serial: StrictInt = Field(ge=1, le=MAX_SERIAL)
    scope: BundleScope


class FreshnessStatement(FrozenModel):
    """One freshness statement (see the module's docstring)."""

    format: Literal["gpuguard-freshness/1"]
    issued_at: StrictStr
    expires: StrictStr
    newest: Tuple[NewestBundle, ...] = Field(default=(), max_length=MAX_NEWEST)
    withdrawn: Tuple[StrictInt, ...] = Field(default=(), max_length=MAX_WITHDRAWN)
    deny_serial: Optional[StrictInt] = Field(default=None, ge=1, le=MAX_SERIAL)

    _times = field_validator("issued_at", "expires")(utc_time)

    @field_validator("withdrawn")
    @classmethod
    def _serials(cls, value: Tuple[int, ...]) -> Tuple[int, ...]:
        if any(not 1 <= serial <= MAX_SERIAL for serial in value):
            raise ValueError(f"a serial is outside 1..{MAX_SERIAL}")
        return value

    @model_validator(mode="after")
    def _lifetime(self) -> "FreshnessStatement":
        hours = (self.expires_at - self.issued).total_seconds() / 3600
        if not 0 < hours <= MAX_FRESHNESS_HOURS:
            raise ValueError(f"expires must be after issued_at and at most {MAX_FRESHNESS_HOURS} hours later")
        return self

    @property
    def issued(self) -> dt.datetime:
        return parse_time(self.issued_at)

    @property
    def expires_at(self) -> dt.datetime:
        return parse_time(self.expires)


def make_statement(newest: Sequence[Tuple[int, BundleScope]], withdrawn: Sequence[int], now: dt.datetime,
                   hours: float, deny_serial: Optional[int] = None) -> FreshnessStatement:
    """The statement of the bundles offered (newest first), the withdrawn serials and the serial of the deny list
    served (None: none), issued ``now`` (pure): for each distinct scope only its newest serial."""
    seen = []
    picked = []
    for serial, scope in newest:
        if scope not in seen:
            seen.append(scope)
            picked.append(NewestBundle(serial=serial, scope=scope))
    issued = now.astimezone(dt.timezone.utc).replace(microsecond=0)
    return FreshnessStatement(format=FRESHNESS_FORMAT, issued_at=issued.strftime(TIME_FORMAT),
                              expires=(issued + dt.timedelta(hours=hours)).strftime(TIME_FORMAT),
                              newest=tuple(picked[:MAX_NEWEST]),
                              withdrawn=tuple(sorted(set(withdrawn)))[-MAX_WITHDRAWN:], deny_serial=deny_serial)


def render_statement(statement: FreshnessStatement) -> bytes:
    """The canonical bytes a statement's signature is made over."""
    data = statement.model_dump(mode="json")
    if data["deny_serial"] is None:  # a hub serving no deny list says what it said before the field existed
        del data["deny_serial"]
    return (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode()


def parse_statement(data: bytes, source: str) -> FreshnessStatement:
    """A statement read from ``data`` (strict JSON, no duplicate keys, encodable text: roles.py's
    :func:`parse_signed_document`); BundleRefused of kind format otherwise."""
    return parse_signed_document(data, source, "freshness statement", FRESHNESS_FORMAT, FreshnessStatement,
                                 MAX_STATEMENT_BYTES)


def newest_for(statement: FreshnessStatement, facts: ScopeFacts) -> Optional[int]:
    """The newest serial the statement names for the host of ``facts`` (None: none)."""
    serials = [item.serial for item in statement.newest if scope_refusal(item.scope, facts) is None]
    return max(serials) if serials else None


def check_statement(host: "Host", root: RootMetadata, data: bytes, signature: bytes, now: dt.datetime,
                    last_issued: Optional[dt.datetime], work: Path, source: str) -> FreshnessStatement:
    """The statement when a threshold of the root's freshness keys signed it, it has not expired and it was not
    issued before ``last_issued`` (the one taken last); BundleRefused with its kind otherwise."""
    statement = parse_statement(data, source)
    data_path, signature_path = work / "freshness.json", work / "freshness.json.sig"
    write_bytes_atomically(str(data_path), data)
    write_bytes_atomically(str(signature_path), signature)
    signers = good_signers(host, data_path, signature_path, root.keyring_bytes(frozenset(root.freshness.keys)),
                           source)
    count = root.freshness.met_by(signers)
    if count < root.freshness.threshold:
        raise BundleRefused(source, f"{count} of the {root.freshness.threshold} signatures the freshness keys of "
                                    f"root version {root.version} must make",
                            kind=KIND_THRESHOLD if count else KIND_SIGNATURE)
    if now >= statement.expires_at:
        raise BundleRefused(source, f"freshness statement expired at {statement.expires}", kind=KIND_FRESHNESS)
    if last_issued is not None and statement.issued < last_issued:
        raise BundleRefused(source, f"freshness statement issued at {statement.issued_at}, before the one taken "
                                    f"last ({last_issued:%Y-%m-%dT%H:%M:%SZ})", kind=KIND_FRESHNESS)
    return statement
