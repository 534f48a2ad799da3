"""The deny list of known-bad versions the hub serves (agent/bundle/deny.py): verified before it is served or stored.

The list lives in ``[hub] root_dir`` as ``deny.json`` with ``deny.json.sig``, beside the roots. The hub judges it as
every host does: a threshold of a policy role of scope ``all`` of the newest root whose chain verifies
(agent/hub/trust.py RootChain), the root not expired. Operators push it with ``POST DENY_PATH`` (admin token,
``gpuguard hub deny push``): a list that does not verify is 422 naming why (its refusal kind), one whose serial is
not above the list in place is 409; each push and refused push is a row of the audit trail. A list placed in the
directory by hand that does not verify is never served: the last list that verified in this process is, and
without one the GET is 503 (``hub_deny_unverified`` logged), so hosts see a failed fetch, not a silent nothing.
The serial served is the ``deny_serial`` of the hub's freshness statement (agent/bundle/freshness.py).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from agent.bundle.deny import DenyList, judge_deny, parse_deny
from agent.bundle.roles import KIND_SIGNATURE, good_signers
from agent.errors import BundleRefused
from agent.files import write_bytes_atomically
from agent.hub.api_models import DenySummary
from agent.hub.bundles import PolicyBundles
from agent.hub.responses import HubHTTPError
from agent.hub.tokens import Principal
from agent.hub.trust import RootChain, deny_files, staged
from agent.log import get_logger
from agent.wire import MAX_SIGNATURE_BYTES

log = get_logger("hub.deny")

DENY_LOCK_KEY = 0x67707567_0043


@dataclass(frozen=True)
class ServedDeny:
    """A deny list that verified: its bytes, signatures, serial, who vouched for it and under which root version."""

    data: bytes
    signature: bytes
    deny: DenyList
    signed_by: str
    root_version: int

    def summary(self, unchanged: bool = False) -> DenySummary:
        return DenySummary(serial=self.deny.serial, sha256=hashlib.sha256(self.data).hexdigest(),
                           entries=len(self.deny.entries), signed_by=self.signed_by, unchanged=unchanged)


class HubDeny:
    """The deny list of ``root_dir``: checked against the root chain, served, pushed (see the module's docstring)."""

    def __init__(self, root_dir: Optional[str], chain: RootChain, bundles: PolicyBundles,
                 clock: Callable[[], Any]) -> None:
        self.root_dir = root_dir
        self.chain = chain
        self.bundles = bundles
        self.clock = clock
        self._lock = threading.Lock()
        self._good: Optional[ServedDeny] = None  # the last list that verified in this process
        self._bad: Optional[bytes] = None  # the sha256 of the files in place that did not verify (logged once)

    def check(self, data: bytes, signature: bytes) -> ServedDeny:
        """``data`` as a deny list a threshold of a fleet-wide policy role of the newest root signed; BundleRefused
        with its kind otherwise."""
        root = self.chain.newest()
        if root is None:
            raise BundleRefused("deny list", f"no root in {self.root_dir} verifies (a deny list is judged by the "
                                             f"root's fleet-wide policy role)", KIND_SIGNATURE)
        deny = parse_deny(data, "deny list")
        with staged(data, signature, "deny.json") as (data_path, signature_path):
            signers = good_signers(self.chain.host, data_path, signature_path, root.keyring_bytes(), "deny list")
        role = judge_deny(root, signers, self.clock(), "deny list")
        return ServedDeny(data=data, signature=signature, deny=deny,
                          signed_by=f"policy role {role} of root version {root.version}", root_version=root.version)

    def served(self) -> Optional[ServedDeny]:
        """The list to serve: the one in place when it verifies, else the last one that did under the same root;
        None when there is none in place; HubHTTPError 503 when one is in place and none verified. Checked again
        when the files or the newest root change (a rotation may drop the keys that signed it)."""
        found = deny_files(self.root_dir)
        if found is None:
            return None
        data, signature = found
        root = self.chain.newest()
        version = root.version if root is not None else 0
        with self._lock:
            good = self._good
            if good is not None and (good.data, good.signature, good.root_version) == (data, signature, version):
                return good
            digest = hashlib.sha256(data + b"\0" + signature + b"\0" + str(version).encode()).digest()
            if digest != self._bad:
                try:
                    checked = self.check(data, signature)
                except BundleRefused as exc:
                    self._bad = digest
                    log.error("hub_deny_unverified", path=f"{self.root_dir}/deny.json", problem=exc.reason,
                              kind=exc.kind, serving=good.deny.serial if good is not None else None)
                else:
                    self._good, self._bad = checked, None
                    return checked
            if good is None or good.root_version != version:  # what verified under an older root is not served
                raise HubHTTPError(503, "deny_unverified", f"the deny list in {self.root_dir} does not verify")
            return good

    def served_serial(self) -> Optional[int]:
        """The serial of the list served, for the freshness statement (None: none served)."""
        try:
            served = self.served()
        except HubHTTPError:
            return None
        return served.deny.serial if served is not None else None

    def _refused(self, principal: Principal, exc: HubHTTPError) -> HubHTTPError:
        self.bundles.store.write("audit", lambda cur: self.bundles.audit_in(cur, principal, "deny_push_refused",
                                                                            None, exc.detail))
        log.info("hub_deny_push_refused", actor=principal.subject, error=exc.error, detail=exc.detail)
        return exc

    def push(self, principal: Principal, data: bytes, signature: bytes) -> DenySummary:
        """Check and put in place a deny list pushed by ``principal`` (see the module's docstring)."""
        if self.root_dir is None:
            raise self._refused(principal, HubHTTPError(
                409, "no_root_dir", "the hub has no [hub] root_dir: deny lists are kept beside its roots"))
        if not signature or len(signature) > MAX_SIGNATURE_BYTES:
            raise self._refused(principal, HubHTTPError(
                422, "invalid_signature", f"signature: must be 1 to {MAX_SIGNATURE_BYTES} bytes, got "
                                          f"{len(signature)} (gpg --detach-sign deny.json makes deny.json.sig)"))
        try:
            checked = self.check(data, signature)
        except BundleRefused as exc:
            raise self._refused(principal, HubHTTPError(
                422, "deny_refused", f"deny list refused ({exc.kind}): {exc.reason}")) from None
        path = Path(self.root_dir) / "deny.json"

        def work(cur: Any) -> bool:
            # One push at a time across hub processes: the serial check and the two files stay together.
            self.bundles.store.dialect.lock(cur, DENY_LOCK_KEY)
            found = deny_files(self.root_dir)
            if found is not None and found == (data, signature):
                return False
            if found is not None:
                try:
                    current: Optional[int] = parse_deny(found[0], str(path)).serial
                except BundleRefused:
                    current = None  # a damaged file in place: the verified list replaces it
                if current is not None and checked.deny.serial <= current:
                    raise HubHTTPError(409, "serial_not_newer", f"deny list serial {checked.deny.serial} is not "
                                                                f"above serial {current} in place; make it again "
                                                                f"with serial {current + 1} or higher")
            write_bytes_atomically(str(path) + ".sig", signature)
            write_bytes_atomically(str(path), data)
            self.bundles.audit_in(cur, principal, "deny_push", None,
                                  f"deny list serial {checked.deny.serial}, sha256 "
                                  f"{hashlib.sha256(data).hexdigest()}, {len(checked.deny.entries)} entries, "
                                  f"signed by {checked.signed_by}")
            return True

        try:
            written = self.bundles.store.write("deny_push", work)
        except HubHTTPError as exc:
            raise self._refused(principal, exc) from None
        if written:
            with self._lock:
                self._good, self._bad = checked, None
            log.info("hub_deny_pushed", actor=principal.subject, serial=checked.deny.serial)
        return checked.summary(unchanged=not written)
