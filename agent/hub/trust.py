"""What the hub serves of the trust chain: the roots it was given, one version per request, the deny list of
known-bad versions, and the freshness statement it signs with its online key (agent/bundle/freshness.py).

Roots are files the operators put in ``[hub] root_dir`` (``N.root.json`` with ``N.root.json.sig``), and so is the
deny list (``deny.json`` with ``deny.json.sig``, agent/bundle/deny.py; or pushed, agent/hub/deny.py), served to
every host whatever a rollout holds back once it verifies against the root chain; hosts verify them all again. The
statement is made from the bundles offered to everyone (newest first), the withdrawn serials and the serial of the
deny list served, signed with ``gpg --homedir [hub] freshness_gnupg_home --local-user [hub] freshness_key``; it is
signed again when what it says changes or a quarter of its lifetime (``[hub] freshness_hours``) has passed, so a
fleet's fetches cost one gpg run per change, not one per host.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, List, Optional, Sequence, Tuple

from agent.bundle.format import BundleScope
from agent.bundle.freshness import FreshnessStatement, make_statement, render_statement
from agent.bundle.roles import MAX_ROOT_BYTES, MAX_SIGNATURES_BYTES, RootMetadata
from agent.errors import BundleRefused, CommandError, InputFileError
from agent.files import FileMissing, read_bytes_bounded, write_bytes_atomically
from agent.host import Host

if TYPE_CHECKING:
    from agent.hub.bundles import SignatureCheck
from agent.hub.responses import HubHTTPError
from agent.log import get_logger

log = get_logger("hub.trust")
GPG_TIMEOUT_SECONDS = 60.0


def root_files(root_dir: Optional[str], version: int) -> Optional[Tuple[bytes, bytes]]:
    """Root ``version`` and its signatures from ``root_dir``; None when there is no such version."""
    if root_dir is None:
        return None
    path = Path(root_dir) / f"{version}.root.json"
    try:
        return (read_bytes_bounded(str(path), MAX_ROOT_BYTES),
                read_bytes_bounded(str(path) + ".sig", MAX_SIGNATURES_BYTES))
    except FileMissing:
        return None
    except InputFileError as exc:
        log.error("hub_root_unreadable", path=str(path), error=str(exc))
        raise HubHTTPError(503, "root_unreadable", f"root version {version} cannot be read") from None


def deny_files(root_dir: Optional[str]) -> Optional[Tuple[bytes, bytes]]:
    """The deny list (``deny.json``) and its signatures (``deny.json.sig``) in ``root_dir``; None when there is
    none. Served once they verify (agent/hub/deny.py); hosts verify them again (agent/bundle/deny.py)."""
    from agent.bundle.deny import MAX_DENY_BYTES

    if root_dir is None:
        return None
    path = Path(root_dir) / "deny.json"
    try:
        return (read_bytes_bounded(str(path), MAX_DENY_BYTES),
                read_bytes_bounded(str(path) + ".sig", MAX_SIGNATURES_BYTES))
    except FileMissing:
        return None
    except InputFileError as exc:
        log.error("hub_deny_unreadable", path=str(path), error=str(exc))
        raise HubHTTPError(503, "deny_unreadable", "the deny list cannot be read") from None


class FreshnessSigner:
    """Signs freshness statements with the hub's online key, keeping the last one while it still holds."""

    def __init__(self, gnupg_home: Optional[str], key: Optional[str], hours: float,
                 clock: Callable[[], dt.datetime], host: Optional[Host] = None) -> None:
        self.host = host or Host()
        self.gnupg_home = gnupg_home
        self.key = key
        self.hours = hours
        self.clock = clock
        self._lock = threading.Lock()
        self._last: Optional[Tuple[FreshnessStatement, bytes, bytes]] = None

    @property
    def enabled(self) -> bool:
        return self.gnupg_home is not None and self.key is not None

    def statement(self, newest: Sequence[Tuple[int, BundleScope]], withdrawn: Sequence[int],
                  deny_serial: Optional[int] = None) -> Tuple[bytes, bytes]:
        """The statement's bytes and signature for what is offered and withdrawn now, and the deny list served."""
        now = self.clock()
        fresh = make_statement(newest, withdrawn, now, self.hours, deny_serial)
        with self._lock:
            if self._last is not None:
                last, data, signature = self._last
                young = now < last.issued + dt.timedelta(hours=self.hours / 4)
                if young and (last.newest, last.withdrawn, last.deny_serial) == (fresh.newest, fresh.withdrawn,
                                                                                  fresh.deny_serial):
                    return data, signature
            data = render_statement(fresh)
            signature = self._sign(data)
            self._last = (fresh, data, signature)
            log.info("hub_freshness_signed", issued_at=fresh.issued_at, expires=fresh.expires,
                     withdrawn=len(fresh.withdrawn), scopes=len(fresh.newest), deny_serial=fresh.deny_serial)
            return data, signature

    def _sign(self, data: bytes) -> bytes:
        assert self.gnupg_home is not None and self.key is not None
        with tempfile.TemporaryDirectory(prefix="gpuguard-hub-freshness-") as work:
            source, target = Path(work) / "freshness.json", Path(work) / "freshness.json.sig"
            write_bytes_atomically(str(source), data)
            try:
                done = self.host.run(["gpg", "--homedir", self.gnupg_home, "--batch", "--yes", "--local-user",
                                      self.key, "--detach-sign", "-o", str(target), str(source)],
                                     GPG_TIMEOUT_SECONDS)
            except CommandError as exc:
                done = None
                error = exc.reason
            if done is None or done.returncode != 0:
                log.error("hub_freshness_unsigned", error=(done.stderr[-500:] if done is not None else error))
                raise HubHTTPError(503, "freshness_unsigned", "the freshness statement cannot be signed now")
            return read_bytes_bounded(str(target), MAX_SIGNATURES_BYTES)


def _root_versions(root_dir: Optional[str]) -> List[int]:
    """The ``N`` of the ``N.root.json`` files in ``root_dir``, lowest first; none without the directory."""
    if root_dir is None:
        return []
    try:
        names = [p.name for p in Path(root_dir).iterdir()]
    except OSError:
        return []
    return sorted(int(n.split(".", 1)[0]) for n in names
                  if n.endswith(".root.json") and n.split(".", 1)[0].isdecimal())


@contextlib.contextmanager
def staged(data: bytes, signature: bytes, name: str) -> Iterator[Tuple[Path, Path]]:
    """``data`` and its detached ``signature`` as two files (``name`` and ``name.sig``) in a private temporary
    directory, for gpgv, removed on leaving."""
    with tempfile.TemporaryDirectory(prefix="gpuguard-hub-check-") as work:
        data_path, signature_path = Path(work) / name, Path(work) / f"{name}.sig"
        write_bytes_atomically(str(data_path), data)
        write_bytes_atomically(str(signature_path), signature)
        yield data_path, signature_path


def gpgv_check(keys_dir: str) -> "SignatureCheck":
    """The hub's signature check without a root: gpgv against the keyrings (``*.gpg``) in ``keys_dir``, the agent's
    own check."""
    from agent.bundle.verify import verify_signature

    def check(data: bytes, signature: bytes) -> str:
        with staged(data, signature, "bundle.json") as (bundle_path, signature_path):
            return verify_signature(Host.for_root("/"), str(bundle_path), str(signature_path), keys_dir,
                                    source="bundle")

    return check


class RootChain:
    """The newest root of ``root_dir`` that the hub may judge pushes by: the lowest version there is taken as the
    operators' first root (signed by a threshold of its own root keys), and each next version only when a
    threshold of the version before it and of its own root keys signed it (agent/bundle/root.py accept_root), as
    every host walks it. A version that does not verify, or a gap, ends the chain there: the versions above it are
    not believed (logged once per change of the files), and the last good one judges. The walk is kept until a root
    file changes (name, size or modification time)."""

    def __init__(self, root_dir: Optional[str], host: Optional[Host] = None) -> None:
        self.root_dir = root_dir
        self.host = host or Host.for_root("/")
        self._lock = threading.Lock()
        self._stamp: Optional[Tuple[Tuple[str, int, int], ...]] = None
        self._root: Optional[RootMetadata] = None

    def _files_stamp(self) -> Tuple[Tuple[str, int, int], ...]:
        assert self.root_dir is not None
        stamps = []
        for version in _root_versions(self.root_dir):
            for name in (f"{version}.root.json", f"{version}.root.json.sig"):
                try:
                    info = os.stat(Path(self.root_dir) / name)
                except OSError:
                    continue
                stamps.append((name, info.st_size, info.st_mtime_ns))
        return tuple(stamps)

    def newest(self) -> Optional[RootMetadata]:
        """The newest root whose chain verifies; None when ``root_dir`` holds no root (or no first root verifies)."""
        if self.root_dir is None:
            return None
        with self._lock:
            stamp = self._files_stamp()
            if stamp != self._stamp:
                self._root = self._walk()
                self._stamp = stamp
            return self._root

    def _walk(self) -> Optional[RootMetadata]:
        from agent.bundle.root import accept_root

        trusted: Optional[RootMetadata] = None
        for version in _root_versions(self.root_dir):
            if trusted is not None and version != trusted.version + 1:
                log.error("hub_root_chain_broken", version=version,
                          problem=f"version {trusted.version + 1} is missing", trusted=trusted.version)
                break
            files = root_files(self.root_dir, version)
            if files is None:
                break
            try:
                taken = accept_root(self.host, trusted, files[0], files[1], f"{self.root_dir}/{version}.root.json")
            except BundleRefused as exc:
                log.error("hub_root_chain_broken", version=version, problem=str(exc), kind=exc.kind,
                          trusted=trusted.version if trusted is not None else None)
                break
            if taken.version != version:
                log.error("hub_root_chain_broken", version=version,
                          problem=f"the file names version {version}, its contents version {taken.version}",
                          trusted=trusted.version if trusted is not None else None)
                break
            trusted = taken
        return trusted


def root_or_keys_check(root_dir: Optional[str], keys_dir: str) -> "SignatureCheck":
    """The hub's check of a pushed bundle's signatures: against the newest root of ``root_dir`` whose chain
    verifies (:class:`RootChain`; a threshold of one of its policy roles, the role's scope left to each host), else
    gpgv against the keyrings in ``keys_dir`` (:func:`gpgv_check`). An admin token alone never gets a bundle stored
    or offered, and neither does a root file the chain does not vouch for."""
    from agent.bundle.roles import KIND_SIGNATURE, KIND_THRESHOLD, good_signers

    by_keys = gpgv_check(keys_dir)
    chain = RootChain(root_dir)

    def check(data: bytes, signature: bytes) -> str:
        if not _root_versions(root_dir):
            return by_keys(data, signature)
        root = chain.newest()
        if root is None:
            raise BundleRefused("bundle", f"no root in {root_dir} verifies (its first root must carry a threshold "
                                          f"of its own root keys' signatures)", KIND_SIGNATURE)
        with staged(data, signature, "bundle.json") as (bundle_path, signature_path):
            signers = good_signers(chain.host, bundle_path, signature_path, root.keyring_bytes(), "bundle")
        met = [role.name for role in root.policy if role.met_by(signers) >= role.threshold]
        if met:
            return f"policy role {met[0]} of root version {root.version}"
        some = any(role.met_by(signers) for role in root.policy)
        raise BundleRefused("bundle", f"no policy role of root version {root.version} has its threshold of "
                                      f"signatures", KIND_THRESHOLD if some else KIND_SIGNATURE)

    return check
