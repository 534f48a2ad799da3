"""The root metadata: which keys may sign what, and how many of them must (TUF's roles and thresholds).

A root (``root.json``, format ``gpuguard-root/1``) is JSON signed by a threshold of its own ``root`` keys, with
gpg detached signatures (one ``.sig`` file may hold several: ``cat a.sig b.sig``) checked by gpgv, never by crypto
in Python. It carries the public keys themselves (``keys``: primary fingerprint -> base64 of ``gpg --export``), so
a rotation travels as data and no host file is edited after the first root, and names three kinds of key sets:

- ``root``: the offline keys that sign the next root (a threshold of the old AND of the new root keys, one version
  at a time, agent/bundle/root.py);
- ``policy``: one or more roles, each a name, the hosts it may speak for (``scope``, the selectors of a bundle's
  scope, agent/bundle/scope.py), its keys and its threshold; a bundle is enforced on a host only when, for one role
  whose scope takes the host, at least ``threshold`` distinct keys of that role made a valid signature over its
  exact bytes;
- ``freshness``: the hub's online key(s), limited to signing freshness statements (agent/bundle/freshness.py),
  never a bundle or a root.

Every refusal is a kind (:data:`KIND_SIGNATURE` ... below; the same words as the refusal kinds of the wire
contract) and a line for people. :func:`parse_signers` and :func:`judge_policy` are pure; :func:`good_signers`
runs gpgv through the Host.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, FrozenSet, List, Literal, Optional, Tuple, Type, TypeVar

from pydantic import Field, StrictInt, StrictStr, ValidationError, field_validator, model_validator

from agent.bundle.format import BundleScope, unencodable_text
from agent.bundle.scope import ScopeFacts, scope_refusal
from agent.bundle.state import BundleState
from agent.errors import BundleRefused, CommandError, InputFileError
from agent.files import write_bytes_atomically
from agent.models import FrozenModel, first_validation_problem
from agent.strictjson import parse_json_text
from agent.validation import parse_time, utc_time
from agent.wire import REFUSAL_KINDS

if TYPE_CHECKING:  # pragma: no cover
    from agent.host import Host

ROOT_FORMAT = "gpuguard-root/1"
MAX_ROOT_BYTES = 1024 * 1024
MAX_SIGNATURES_BYTES = 64 * 1024
MAX_ROLE_KEYS = 64
GPGV_TIMEOUT_SECONDS = 30.0
Document = TypeVar("Document", bound=FrozenModel)



def _kind(word: str) -> str:
    """A word of agent/wire.py's REFUSAL_KINDS (their one home), checked when this module loads."""
    if word not in REFUSAL_KINDS:
        raise ValueError(f"{word!r} is not a refusal kind of agent/wire.py")
    return word


# The refusal kinds this module and its neighbours raise.
KIND_SIGNATURE = _kind("signature")
KIND_THRESHOLD = _kind("threshold")
KIND_EXPIRED = _kind("expired")
KIND_ROLLBACK = _kind("rollback")
KIND_SCOPE = _kind("scope")
KIND_FORMAT = _kind("format")
KIND_FRESHNESS = _kind("freshness")

_STATUS_PREFIX = "[GNUPG:] "
# A signature counts only with GOODSIG and VALIDSIG and none of these in its NEWSIG group.
_SPOILING = frozenset({"BADSIG", "EXPSIG", "EXPKEYSIG", "REVKEYSIG", "ERRSIG", "NO_PUBKEY", "NODATA"})
_HEX = frozenset("0123456789ABCDEF")


def _fingerprint(value: str) -> str:
    if len(value) not in (40, 64) or not set(value) <= _HEX:
        raise ValueError(f"{value!r} is not a primary key fingerprint (40 or 64 upper-case hex digits)")
    return value


class KeySet(FrozenModel):
    """Keys (primary fingerprints) and how many of them must sign (k-of-n)."""

    keys: Tuple[StrictStr, ...] = Field(min_length=1, max_length=MAX_ROLE_KEYS)
    threshold: StrictInt = Field(ge=1)

    @field_validator("keys")
    @classmethod
    def _distinct(cls, value: Tuple[str, ...]) -> Tuple[str, ...]:
        for key in value:
            _fingerprint(key)
        if len(set(value)) != len(value):
            raise ValueError("a key is named twice")
        return value

    @model_validator(mode="after")
    def _reachable(self) -> "KeySet":
        if self.threshold > len(self.keys):
            raise ValueError(f"threshold {self.threshold} is more than the {len(self.keys)} key(s) named")
        return self

    def met_by(self, signers: FrozenSet[str]) -> int:
        """How many of this set's keys are among ``signers``."""
        return len(signers & set(self.keys))


class PolicyRole(KeySet):
    """Keys that may sign policy bundles for the hosts ``scope`` takes."""

    name: StrictStr = Field(min_length=1, max_length=128)
    scope: BundleScope


class RootMetadata(FrozenModel):
    """One version of the root (see the module's docstring)."""

    format: Literal["gpuguard-root/1"]
    version: StrictInt = Field(ge=1, le=2**63 - 1)
    expires: StrictStr
    keys: Dict[StrictStr, StrictStr] = Field(min_length=1, max_length=4 * MAX_ROLE_KEYS)
    root: KeySet
    freshness: KeySet
    policy: Tuple[PolicyRole, ...] = Field(min_length=1, max_length=MAX_ROLE_KEYS)

    _check_expires = field_validator("expires")(utc_time)

    @field_validator("keys")
    @classmethod
    def _key_blocks(cls, value: Dict[str, str]) -> Dict[str, str]:
        for fingerprint, block in value.items():
            _fingerprint(fingerprint)
            try:
                base64.b64decode(block, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"{fingerprint}: not base64 (the key as gpg --export writes it)") from None
        return value

    @model_validator(mode="after")
    def _roles_name_known_keys(self) -> "RootMetadata":
        names = [role.name for role in self.policy]
        if len(set(names)) != len(names):
            raise ValueError("policy: a role name is used twice")
        signing = {*self.root.keys, *(key for role in self.policy for key in role.keys)}
        for key in sorted({*signing, *self.freshness.keys}):
            if key not in self.keys:
                raise ValueError(f"key {key} is named by a role but not given in keys")
        shared = sorted(signing & set(self.freshness.keys))
        if shared:
            raise ValueError(f"freshness key {shared[0]} also signs root or policy (the online key may sign "
                             f"freshness statements only)")
        return self

    @property
    def expires_at(self) -> dt.datetime:
        return parse_time(self.expires)

    def keyring_bytes(self, fingerprints: Optional[FrozenSet[str]] = None) -> bytes:
        """The public keys (those named, or all) as one binary keyring for gpgv."""
        return b"".join(base64.b64decode(block) for key, block in sorted(self.keys.items())
                        if fingerprints is None or key in fingerprints)


def parse_signed_document(data: bytes, source: str, what: str, document_format: str, model: Type[Document],
                          max_bytes: int) -> Document:
    """The signed document (a root, a freshness statement, a deny list; ``what`` names it in refusals) read from
    ``data``: at most ``max_bytes``, UTF-8, strict JSON with no key named twice and no text UTF-8 cannot encode, its
    ``format`` ``document_format``, valid as ``model``; BundleRefused of kind format, in one line, otherwise."""
    if len(data) > max_bytes:
        raise BundleRefused(source, f"{what} is {len(data)} bytes, more than {max_bytes}", kind=KIND_FORMAT)
    try:
        value = parse_json_text(source, data.decode("utf-8"), unique_keys=True)
    except UnicodeDecodeError as exc:
        raise BundleRefused(source, f"{what} is not UTF-8 (byte {exc.start})", kind=KIND_FORMAT) from None
    except InputFileError as exc:
        raise BundleRefused(source, f"{what} is {exc.reason}", kind=KIND_FORMAT) from None
    problem = unencodable_text(value, what)
    if problem is not None:
        raise BundleRefused(source, problem, kind=KIND_FORMAT)
    if not isinstance(value, dict) or value.get("format") != document_format:
        raise BundleRefused(source, f"not a {what}: format is not {document_format!r}", kind=KIND_FORMAT)
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise BundleRefused(source, f"{what}: {first_validation_problem(exc)}", kind=KIND_FORMAT) from None


def parse_root(data: bytes, source: str) -> RootMetadata:
    """A root read from ``data`` (:func:`parse_signed_document`); BundleRefused of kind format otherwise."""
    return parse_signed_document(data, source, "root", ROOT_FORMAT, RootMetadata, MAX_ROOT_BYTES)


def parse_signers(text: str) -> FrozenSet[str]:
    """The primary fingerprints of the good signatures in gpgv's ``--status-fd`` output (pure): one per NEWSIG
    group that has GOODSIG and VALIDSIG and no refusing word (a bad, expired, revoked or unknown signature beside
    good ones counts for nothing; gpgv's exit status then says failure, so it is not read)."""
    groups: List[List[List[str]]] = []
    for line in text.splitlines():
        if not line.startswith(_STATUS_PREFIX):
            continue
        fields = line[len(_STATUS_PREFIX):].split()
        if not fields:
            continue
        if fields[0] == "NEWSIG" or not groups:
            groups.append([])
        groups[-1].append(fields)
    signers = set()
    for group in groups:
        words = {fields[0] for fields in group}
        valid = [fields for fields in group if fields[0] == "VALIDSIG"]
        if "GOODSIG" not in words or words & _SPOILING or len(valid) != 1:
            continue
        fields = valid[0][1:]
        # VALIDSIG <fpr> <date> <ts> <expire> <ver> <reserved> <algo> <hash> <class> [<primary-key-fpr>]
        primary = fields[9] if len(fields) >= 10 else fields[0] if fields else ""
        if primary:
            signers.add(primary.upper())
    return frozenset(signers)


def good_signers(host: "Host", data_path: Path, signature_path: Path, keyring: bytes, source: str) -> FrozenSet[str]:
    """The keys of ``keyring`` (binary) that made a good signature over the file at ``data_path`` (gpgv through the
    Host's runner); the keyring is written beside the data and removed again."""
    keyring_path = data_path.parent / f".{data_path.name}.keyring.gpg"
    write_bytes_atomically(str(keyring_path), keyring)
    argv = ["gpgv", "--status-fd", "1", "--weak-digest", "SHA1", "--weak-digest", "RIPEMD160",
            "--keyring", str(keyring_path), str(signature_path), str(data_path)]
    try:
        result = host.run(argv, GPGV_TIMEOUT_SECONDS)
    except CommandError as exc:
        raise BundleRefused(source, f"the signatures cannot be checked: {exc.reason}", kind=KIND_SIGNATURE) from None
    finally:
        keyring_path.unlink(missing_ok=True)
    return parse_signers(result.stdout)


def _short(keys: FrozenSet[str]) -> str:
    return ", ".join(sorted(key[-16:] for key in keys)) or "none"


def judge_policy(root: RootMetadata, signers: FrozenSet[str], facts: ScopeFacts, now: dt.datetime,
                 source: str) -> PolicyRole:
    """The policy role that vouches for a bundle signed by ``signers`` on the host of ``facts`` (pure): the first
    role, in the root's order, whose scope takes the host and whose threshold the signers meet. BundleRefused
    otherwise, of kind expired (the root itself), scope (a role that is met speaks for other hosts), threshold
    (keys of a role signed, too few) or signature (no key of any policy role signed)."""
    if now >= root.expires_at:
        raise BundleRefused(source, f"root version {root.version} expired at {root.expires} (a newer root must be "
                                    f"installed: gpuguard policy trust-root FILE, or the hub's)", kind=KIND_EXPIRED)
    met_elsewhere: Optional[Tuple[PolicyRole, str]] = None
    short: Optional[PolicyRole] = None
    for role in root.policy:
        count = role.met_by(signers)
        refusal = scope_refusal(role.scope, facts)
        if count >= role.threshold:
            if refusal is None:
                return role
            met_elsewhere = met_elsewhere or (role, refusal)
        elif count and refusal is None and short is None:
            short = role
    if met_elsewhere is not None:
        role, refusal = met_elsewhere
        raise BundleRefused(source, f"signed by policy role {role.name!r}, which may not sign for this host "
                                    f"({refusal})", kind=KIND_SCOPE)
    if short is not None:
        raise BundleRefused(source, f"{short.met_by(signers)} of the {short.threshold} signatures policy role "
                                    f"{short.name!r} needs (valid: {_short(signers)})", kind=KIND_THRESHOLD)
    raise BundleRefused(source, f"no valid signature by a policy key of root version {root.version} "
                                f"(valid: {_short(signers)})", kind=KIND_SIGNATURE)


def check_bundle_expiry(expires: Optional[str], now: dt.datetime, source: str, serial: int) -> dt.datetime:
    """The bundle's expiry time; BundleRefused of kind format when it carries none (a root in force asks every
    bundle to) and of kind expired when it is past."""
    if expires is None:
        raise BundleRefused(source, "the bundle carries no expires (every bundle must under a root: gpuguard "
                                    "policy bundle --expires-days N)", KIND_FORMAT, serial)
    moment = parse_time(expires)
    if now >= moment:
        raise BundleRefused(source, f"serial {serial} expired at {expires}", KIND_EXPIRED, serial)
    return moment


@dataclass(frozen=True)
class Vouched:
    """The policy role that vouches for a bundle and its keys that signed it (sorted)."""

    role: str
    signers: Tuple[str, ...]


def vouch(host: "Host", root: RootMetadata, bundle_path: Path, signature_path: Path, facts: ScopeFacts,
          now: dt.datetime, source: str) -> Vouched:
    """Check a bundle's signatures against the root's policy roles (gpgv, then :func:`judge_policy`)."""
    signers = good_signers(host, bundle_path, signature_path, root.keyring_bytes(), source)
    role = judge_policy(root, signers, facts, now, source)
    return Vouched(role.name, tuple(sorted(signers & set(role.keys))))


def floor_reset(root: Optional[RootMetadata], state: BundleState) -> bool:
    """Whether the serial floor of the bundle in force is void: a key that signed it is no longer a key of its
    policy role in the root trusted now (rotated out after a compromise: TUF's fast-forward recovery). The bundle
    in force keeps guarding; only the floor a newer bundle must rise above is gone."""
    if root is None or state.role is None or not state.signers:
        return False
    keys = {role.name: set(role.keys) for role in root.policy}.get(state.role, set())
    return not set(state.signers) <= keys
