"""The policy bundles the hub keeps and offers: push, list, show, withdraw, the audit trail, and which bundle a host
gets.

A push is parsed as the agent parses a bundle (``agent.bundle.format.parse_bundle``) and its signature verified with
gpgv against the keyrings of the hub's ``policy_keys_dir`` (``agent.bundle.verify.verify_signature``, the agent's
own check, keys-directory safety included) before anything is stored: an admin token alone cannot store or offer a
bundle, nor raise the serial floor (a refused push is 422, audited, and stores nothing). The knowledge tables a
bundle carries are parsed by the agent's own strict parser (``agent.policy.knowledge_files.check_carried``) first:
a malformed one is 422 naming the file and the field, audited as a refused push. The agents verify again
against their own trusted keys. The signature is kept beside the bytes it signs. Whether a serial
is new is decided in the database: one transaction holds every other push off (``Dialect.lock``; SQLite's BEGIN
IMMEDIATE), reads the highest stored serial and inserts only above it, so of two pushes of one serial exactly one
is stored and the other is 409. Every push, refused push and withdrawal is a row of ``audit``.

A host is offered the newest bundle that is not withdrawn and whose scope takes it, judged by
``agent.bundle.scope.scope_refusal`` over the facts its heartbeats gave the hub (labels, pairing): the same
function the agent judges by. A withdrawn bundle is no longer offered; an agent never goes back to a lower serial
by itself, so to revert an operator pushes the old policy again under a new serial.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from agent.bundle.format import BundleInvalid, BundleScope, PolicyBundle, parse_bundle
from agent.bundle.scope import scope_facts, scope_refusal
from agent.errors import BundleRefused
from agent.hub.responses import HubHTTPError
from agent.hub.rows import AuditEntry, BundleSummary, HostRow, utc_now
from agent.hub.store import SqlStore
from agent.hub.tokens import Principal
from agent.log import get_logger
from agent.models import FrozenModel
from agent.policy.knowledge import KnowledgeInvalid
from agent.policy.knowledge_files import check_carried
from agent.wire import MAX_SIGNATURE_BYTES, POLICY_ATTENTION, REFUSAL_KINDS, etag_of

log = get_logger("hub.bundles")

# PostgreSQL advisory lock held by a push's transaction: pushes from several hub processes take turns.
PUSH_LOCK_KEY = 0x67707567_0032
_SUMMARY_COLUMNS = ("serial, sha256, scope, matrix_version, created_at, created_by, pushed_at, pushed_by, "
                    "withdrawn_at, withdrawn_by, LENGTH(bundle), staged")


class OfferedBundle(FrozenModel):
    """The bundle a host is offered: its serial, bytes and signature."""

    serial: int
    bundle: bytes
    signature: bytes

    @property
    def etag(self) -> str:
        return etag_of(self.serial)


def scope_text(scope: Mapping[str, Any]) -> str:
    """A bundle scope (its JSON) as one short line: ``all hosts``, or each selector."""
    if scope.get("all"):
        return "all hosts"
    parts = [f"{name}={','.join(scope[name])}" for name in ("host_ids", "gpu_models", "os", "pairings")
             if scope.get(name)]
    parts += [f"label {key}={value}" for key, value in sorted((scope.get("labels") or {}).items())]
    return "; ".join(parts) or "no host"


def offered_serial(scopes: Sequence[Tuple[int, BundleScope]], host_id: str,
                   host: Optional[HostRow]) -> Optional[int]:
    """The newest serial among ``scopes`` (newest first, none withdrawn) whose scope takes the host, judged by what
    its heartbeats told (``host``; None for a host not heard from yet: only its id is known); pure."""
    facts = scope_facts(host_id, (host.labels if host else None) or {}, host.pairing if host else None)
    for serial, scope in scopes:
        if scope_refusal(scope, facts) is None:
            return serial
    return None


class HostPolicy(FrozenModel):
    """One host's policy as the fleet sees it: what it enforces, what it is offered, what it refused."""

    host_id: str
    hostname: str
    policy_source: Optional[str] = None
    policy_serial: Optional[int] = None
    offered_serial: Optional[int] = None  # the newest bundle in its scope, not withdrawn (None: none)
    behind: bool = False  # offered a serial it does not enforce yet
    # enforces a serial above every one the hub offers (a fast-forward: every honest bundle now looks old to it)
    ahead: bool = False
    refused: bool = False  # its last refusal is newer than what it enforces (or names no verified serial)
    refused_serial: Optional[int] = None  # that refused bundle's serial, when a verified bundle said it
    refused_reason: Optional[str] = None
    refused_kind: Optional[str] = None  # why (agent/wire.py's REFUSAL_KINDS): what is counted
    # what its newest heartbeat says asks for attention though its policy keeps guarding (agent/wire.py's
    # POLICY_ATTENTION: "expired", "freshness", "denied"); empty when nothing does or the agent does not say
    attention: Tuple[str, ...] = ()


class PolicyRollout(FrozenModel):
    """Where the fleet stands with its policy bundles."""

    newest_serial: Optional[int] = None  # the newest bundle not withdrawn, whatever its scope
    host_count: int
    behind_count: int
    refused_count: int
    ahead_count: int = 0  # hosts enforcing a serial above every one offered
    # hosts refusing, per kind: every kind of agent/wire.py's REFUSAL_KINDS, 0 included ("unknown": an older agent's)
    refused_by_kind: Dict[str, int] = {}
    # hosts whose newest heartbeat reports each attention word of agent/wire.py's POLICY_ATTENTION (0 included)
    attention_by_word: Dict[str, int] = {}
    hosts: List[HostPolicy]


def host_policy(host: HostRow, scopes: Sequence[Tuple[int, BundleScope]]) -> HostPolicy:
    """One host's standing against the offered bundles ``scopes`` (newest first); pure."""
    offered = offered_serial(scopes, host.host_id, host)
    enforced = host.policy_serial
    refused = host.policy_refused_serial
    # The agent sends a refusal only while it is newer than what it enforces; one without a serial (a signature
    # that failed: the hub's claim is never kept) counts as such.
    refused_now = (refused is not None or host.policy_refused_kind is not None) and (
        refused is None or enforced is None or refused > enforced)
    newest_offered = max((serial for serial, _ in scopes), default=None)
    return HostPolicy(host_id=host.host_id, hostname=host.hostname, policy_source=host.policy_source,
                      policy_serial=enforced, offered_serial=offered,
                      behind=offered is not None and (enforced is None or enforced < offered),
                      ahead=enforced is not None and newest_offered is not None and enforced > newest_offered,
                      refused=refused_now, refused_serial=refused if refused_now else None,
                      refused_reason=host.policy_refused_reason if refused_now else None,
                      refused_kind=host.policy_refused_kind if refused_now else None,
                      attention=tuple(w for w in POLICY_ATTENTION if w in (host.policy_attention or ())))


def policy_rollout(hosts: Sequence[HostRow], scopes: Sequence[Tuple[int, BundleScope]]) -> PolicyRollout:
    """Every host's standing, and the counts /metrics and the dashboard show; pure."""
    rows = [host_policy(host, scopes) for host in hosts]
    return PolicyRollout(newest_serial=scopes[0][0] if scopes else None, host_count=len(rows),
                         behind_count=sum(r.behind for r in rows), refused_count=sum(r.refused for r in rows),
                         ahead_count=sum(r.ahead for r in rows), refused_by_kind=refusals_by_kind(rows),
                         attention_by_word={w: sum(w in r.attention for r in rows) for w in POLICY_ATTENTION},
                         hosts=rows)


def refusals_by_kind(rows: Sequence[HostPolicy]) -> Dict[str, int]:
    """How many hosts refuse, per kind: each of REFUSAL_KINDS (0 included), and ``unknown`` for a refusal an older
    agent sent without one."""
    counts = {kind: 0 for kind in REFUSAL_KINDS}
    for row in rows:
        if row.refused:
            kind = row.refused_kind if row.refused_kind in counts else "unknown"
            counts[kind] = counts.get(kind, 0) + 1
    return counts


# What the hub asks of a pushed bundle's signature: the signing key's fingerprint, or BundleRefused saying why.
SignatureCheck = Callable[[bytes, bytes], str]


class PolicyBundles:
    """The bundles in the hub's store, and their audit trail."""

    def __init__(self, store: SqlStore, verify: SignatureCheck, clock: Callable[[], dt.datetime] = utc_now) -> None:
        self.store = store
        self.verify = verify
        self.clock = clock
        self._scopes: Dict[int, BundleScope] = {}  # a serial's scope never changes: parsed once per process
        # Serials whose stored signature does not verify against the hub's keys (stored before the hub verified
        # pushes): never offered. Checked once per process, at the first offer.
        self._unverified: Set[int] = set()
        self._verified: Set[int] = set()  # serials whose signature verified in this process
        self._lock = threading.Lock()

    def _db_time(self, value: dt.datetime) -> Any:
        return self.store.dialect.to_db_time(value)

    def audit_in(self, cur: Any, principal: Principal, action: str, serial: Optional[int], detail: str) -> None:
        """One audit row, in the caller's transaction ``cur``."""
        cur.execute(self.store.dialect.sql("INSERT INTO audit (at, actor, role, action, serial, detail) "
                                           "VALUES (?, ?, ?, ?, ?, ?)"),
                    (self._db_time(self.clock()), principal.subject, principal.role, action, serial, detail))

    def _refused(self, principal: Principal, serial: Optional[int], exc: HubHTTPError) -> HubHTTPError:
        """Record a refused push in the audit trail (its own transaction: the push's was rolled back)."""
        self.store.write("audit", lambda cur: self.audit_in(cur, principal, "push_refused", serial, exc.detail))
        log.info("hub_bundle_push_refused", actor=principal.subject, serial=serial, error=exc.error,
                 detail=exc.detail)
        return exc

    # --- writes -------------------------------------------------------------------------------------------
    def push(self, principal: Principal, data: bytes, signature: bytes, staged: bool = False) -> BundleSummary:
        """Store a bundle pushed by ``principal``; 422 for one that does not parse or whose signature no trusted
        key made (checked before anything is stored: a refused push never raises the serial floor), 409 for a
        serial not above every stored one. A ``staged`` bundle is offered to no host until a staged rollout admits
        it, and to its whole scope once that rollout is done (a push and ``rollout start`` are two steps: without
        it, a host fetching in between would take the target)."""
        try:
            bundle = parse_bundle(data, "bundle")
        except BundleInvalid as exc:
            raise self._refused(principal, None, HubHTTPError(422, "invalid_bundle", str(exc))) from None
        try:
            check_carried(bundle.knowledge)  # the agent's own parser: a table no host would install is not kept
        except KnowledgeInvalid as exc:
            raise self._refused(principal, None, HubHTTPError(
                422, "invalid_bundle", f"not a policy bundle: {exc} (the bundle claims serial {bundle.serial})")) \
                from None
        if not signature or len(signature) > MAX_SIGNATURE_BYTES:
            raise self._refused(principal, bundle.serial, HubHTTPError(
                422, "invalid_signature", f"signature: must be 1 to {MAX_SIGNATURE_BYTES} bytes, got "
                                          f"{len(signature)} (gpg --detach-sign BUNDLE makes BUNDLE.sig)"))
        try:
            fingerprint = self.verify(data, signature)
        except BundleRefused as exc:
            # Audited without a serial: what an unverified bundle claims is not kept as a fact (the detail says it).
            raise self._refused(principal, None, HubHTTPError(
                422, "signature_refused", f"signature: refused: {exc.reason} (the bundle claims serial "
                                          f"{bundle.serial})")) from None
        sha256 = hashlib.sha256(data).hexdigest()
        now = self.clock()
        sql = self.store.dialect.sql

        def work(cur: Any) -> None:
            self.store.dialect.lock(cur, PUSH_LOCK_KEY)
            newest = self._floor(cur)
            if newest is not None and bundle.serial <= newest:
                raise HubHTTPError(409, "serial_not_newer",
                                   f"serial {bundle.serial} is not above {newest}, the highest stored; "
                                   f"make the bundle again with --serial {newest + 1} or higher")
            cur.execute(sql("SELECT COUNT(*) FROM policy_bundles WHERE serial = ?"), (bundle.serial,))
            if cur.fetchone()[0]:
                raise HubHTTPError(409, "serial_not_newer",
                                   f"serial {bundle.serial} is taken by a stored bundle whose signature does not "
                                   f"verify; make the bundle again with another serial")
            cur.execute(sql("INSERT INTO policy_bundles (serial, bundle, signature, sha256, scope, matrix_version, "
                            "created_at, created_by, pushed_at, pushed_by, staged) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
                        (bundle.serial, data, signature, sha256, bundle.scope.model_dump_json(),
                         bundle.matrix_version, bundle.created_at, bundle.created_by, self._db_time(now),
                         principal.subject, int(staged)))
            with self._lock:
                self._verified.add(bundle.serial)
            self.audit_in(cur, principal, "push", bundle.serial, f"sha256 {sha256}, {len(data)} bytes, "
                                                               f"created by {bundle.created_by}, signed by key "
                                                               f"{fingerprint}"
                                                               + (", staged (offered through a rollout only)"
                                                                  if staged else ""))

        try:
            self.store.write("policy_push", work)
        except HubHTTPError as exc:
            raise self._refused(principal, bundle.serial, exc) from None
        log.info("hub_bundle_pushed", actor=principal.subject, serial=bundle.serial, sha256=sha256)
        return self.summary(bundle.serial)

    def withdraw(self, principal: Principal, serial: int) -> BundleSummary:
        """Stop offering bundle ``serial``; 404 for an unknown serial, 409 for one already withdrawn."""
        self.store.write("policy_withdraw",
                         lambda cur: self.withdraw_in(cur, principal, serial, "no longer offered to hosts"))
        log.info("hub_bundle_withdrawn", actor=principal.subject, serial=serial)
        return self.summary(serial)

    def withdraw_in(self, cur: Any, principal: Principal, serial: int, detail: str, missing_ok: bool = False) -> bool:
        """Withdraw bundle ``serial`` in the caller's transaction ``cur`` and audit it; True when it was withdrawn
        now. 404/409 for an unknown or already withdrawn serial unless ``missing_ok``."""
        sql = self.store.dialect.sql
        cur.execute(sql("UPDATE policy_bundles SET withdrawn_at = ?, withdrawn_by = ? "
                        "WHERE serial = ? AND withdrawn_at IS NULL"),
                    (self._db_time(self.clock()), principal.subject, serial))
        if cur.rowcount != 1:
            if missing_ok:
                return False
            cur.execute(sql("SELECT withdrawn_by FROM policy_bundles WHERE serial = ?"), (serial,))
            row = cur.fetchone()
            if row is None:
                raise _not_found(serial)
            raise HubHTTPError(409, "already_withdrawn", f"bundle {serial} was already withdrawn by {row[0]}")
        self.audit_in(cur, principal, "withdraw", serial, detail)
        return True

    # --- reads --------------------------------------------------------------------------------------------
    def _summary_of(self, row: Sequence[Any]) -> BundleSummary:
        from_db_time = self.store.dialect.from_db_time
        (serial, sha256, scope, matrix_version, created_at, created_by, pushed_at, pushed_by, withdrawn_at,
         withdrawn_by, size, staged) = row
        return BundleSummary(serial=serial, sha256=sha256, bundle_bytes=size, scope=json.loads(scope),
                             matrix_version=matrix_version, created_at=created_at, created_by=created_by,
                             pushed_at=from_db_time(pushed_at), pushed_by=pushed_by,
                             withdrawn_at=None if withdrawn_at is None else from_db_time(withdrawn_at),
                             withdrawn_by=withdrawn_by, staged=bool(staged))

    def summaries(self) -> List[BundleSummary]:
        """Every stored bundle, newest serial first."""
        rows = self.store.query("policy_list", f"SELECT {_SUMMARY_COLUMNS} FROM policy_bundles ORDER BY serial DESC")
        return [self._summary_of(row) for row in rows]

    def summary(self, serial: int) -> BundleSummary:
        """Bundle ``serial`` without its bytes; 404 when there is none."""
        rows = self.store.query("policy_show", f"SELECT {_SUMMARY_COLUMNS} FROM policy_bundles WHERE serial = ?",
                                [serial])
        if not rows:
            raise _not_found(serial)
        return self._summary_of(rows[0])

    def content(self, serial: int) -> Tuple[bytes, bytes]:
        """Bundle ``serial``'s bytes and signature; 404 when there is none."""
        rows = self.store.query("policy_show", "SELECT bundle, signature FROM policy_bundles WHERE serial = ?",
                                [serial])
        if not rows:
            raise _not_found(serial)
        return bytes(rows[0][0]), bytes(rows[0][1])

    def bundle(self, serial: int) -> PolicyBundle:
        """Bundle ``serial`` parsed (it parsed when it was pushed)."""
        return parse_bundle(self.content(serial)[0], f"bundle {serial}")

    def audit(self, limit: int = 100) -> List[AuditEntry]:
        """The newest ``limit`` audit entries, newest first."""
        rows = self.store.query("audit", "SELECT at, actor, role, action, serial, detail FROM audit "
                                         "ORDER BY at DESC, id DESC LIMIT ?", [limit])
        from_db_time = self.store.dialect.from_db_time
        return [AuditEntry(at=from_db_time(r[0]), actor=r[1], role=r[2], action=r[3], serial=r[4], detail=r[5])
                for r in rows]

    def offered_scopes(self, staged_serial: Optional[int] = None) -> List[Tuple[int, BundleScope]]:
        """(serial, scope) of every bundle not withdrawn and not staged (but ``staged_serial``, a rollout's target
        for its admitted hosts), newest first; a bundle whose signature does not verify against the hub's keys (one
        stored before the hub verified pushes) is left out."""
        rows = self.store.query("policy_offer", "SELECT serial, scope, staged FROM policy_bundles "
                                                "WHERE withdrawn_at IS NULL ORDER BY serial DESC")
        scopes = []
        with self._lock:
            for serial, scope_json, staged in rows:
                if (staged and int(serial) != staged_serial) or serial in self._unverified:
                    continue
                scope = self._scopes.get(serial)
                if scope is None:
                    if not self._verifies(int(serial)):
                        self._unverified.add(serial)
                        continue
                    scope = self._scopes[serial] = BundleScope.model_validate_json(scope_json)
                scopes.append((int(serial), scope))
        return scopes

    def withdrawn_serials(self) -> List[int]:
        """Every withdrawn serial, ascending (what the freshness statement makes a signed fact)."""
        rows = self.store.query("policy_withdrawn", "SELECT serial FROM policy_bundles WHERE withdrawn_at IS NOT NULL "
                                                    "ORDER BY serial")
        return [int(serial) for (serial,) in rows]

    def _floor(self, cur: Any) -> Optional[int]:
        """The highest stored serial whose bundle verifies against the hub's keys, withdrawn or not, in the push's
        transaction: a bundle that never verified (stored before the hub verified pushes) raises no floor."""
        cur.execute("SELECT serial FROM policy_bundles ORDER BY serial DESC")
        for (serial,) in cur.fetchall():
            serial = int(serial)
            with self._lock:
                known_bad = serial in self._unverified
                known_good = serial in self._scopes or serial in self._verified
            if known_good:
                return serial
            if known_bad:
                continue
            cur.execute(self.store.dialect.sql("SELECT bundle, signature FROM policy_bundles WHERE serial = ?"),
                        (serial,))
            data, signature = cur.fetchone()
            good = self._signature_holds(serial, bytes(data), bytes(signature))
            with self._lock:
                (self._verified if good else self._unverified).add(serial)
            if good:
                return serial
        return None

    def _signature_holds(self, serial: int, data: bytes, signature: bytes) -> bool:
        try:
            self.verify(data, signature)
        except BundleRefused as exc:
            log.warning("hub_bundle_unverified", serial=serial, reason=exc.reason, kept="not offered, no floor")
            return False
        return True

    def _verifies(self, serial: int) -> bool:
        """Whether stored bundle ``serial`` verifies against the hub's keys now (logged when it does not)."""
        if serial in self._verified:
            return True
        data, signature = self.content(serial)
        return self._signature_holds(serial, data, signature)

    def offer_serial(self, host_id: str) -> Optional[int]:
        """The serial a host is offered now (None: no bundle in its scope)."""
        scopes = self.offered_scopes()
        if not scopes:
            return None
        return offered_serial(scopes, host_id, self.store.host(host_id))

    def rollout(self) -> PolicyRollout:
        """Every host's standing with the bundles offered now."""
        return policy_rollout(self.store.hosts(), self.offered_scopes())

    def host_policy(self, host: HostRow) -> HostPolicy:
        """One host's standing with the bundles offered now."""
        return host_policy(host, self.offered_scopes())

    def offer(self, serial: int) -> OfferedBundle:
        """Bundle ``serial`` as a host fetches it."""
        data, signature = self.content(serial)
        return OfferedBundle(serial=serial, bundle=data, signature=signature)


def _not_found(serial: int) -> HubHTTPError:
    return HubHTTPError(404, "not_found", f"no bundle with serial {serial}")
