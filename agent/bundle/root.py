"""The root a host trusts, its first installation and its rotation one version at a time.

The first root comes as files, once per host: ``root.json`` and ``root.json.sig`` in the keys directory
(``/etc/gpuguard/keys``, under the same owner/mode checks as the keyrings) or ``gpuguard policy trust-root FILE``;
it must carry a threshold of its own root keys' signatures. From then on the trusted root lives in the state
directory (``policy-bundle/root.json``, its ``.sig`` beside it) and changes only by a rotation: root version N+1 is
taken when a threshold of version N's root keys AND a threshold of its own root keys signed its exact bytes, and
a chain is walked one version at a time, at most :data:`MAX_ROOT_ROTATIONS` steps per walk (python-tuf's bound).
A version not above the trusted one is refused (kind rollback), one that skips a version (format); after a walk a
root already expired is refused (expired), the versions before it kept (each was validly signed).
"""

from __future__ import annotations

import datetime as dt
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, Tuple

from agent.bundle.roles import (
    KIND_EXPIRED,
    KIND_FORMAT,
    KIND_ROLLBACK,
    KIND_SIGNATURE,
    KIND_THRESHOLD,
    MAX_ROOT_BYTES,
    MAX_SIGNATURES_BYTES,
    KeySet,
    RootMetadata,
    good_signers,
    parse_root,
)
from agent.bundle.verify import keyring_problem
from agent.errors import BundleRefused, InputFileError
from agent.files import FileMissing, read_bytes_bounded, write_bytes_atomically
from agent.statepaths import StatePaths

if TYPE_CHECKING:  # pragma: no cover
    from agent.host import Host

ROOT_FILE_NAME = "root.json"
MAX_ROOT_ROTATIONS = 32


def _signed_by(host: "Host", work: Path, data: bytes, signature: bytes, keyring: bytes, source: str) -> frozenset:
    data_path, signature_path = work / "root.json", work / "root.json.sig"
    write_bytes_atomically(str(data_path), data)
    write_bytes_atomically(str(signature_path), signature)
    return good_signers(host, data_path, signature_path, keyring, source)


def _require(keyset: KeySet, signers: frozenset, whose: str, source: str) -> None:
    count = keyset.met_by(signers)
    if count < keyset.threshold:
        raise BundleRefused(source, f"{count} of the {keyset.threshold} signatures {whose} root keys must make",
                            kind=KIND_THRESHOLD if count else KIND_SIGNATURE)


def accept_root(host: "Host", trusted: Optional[RootMetadata], data: bytes, signature: bytes,
                source: str) -> RootMetadata:
    """The root in ``data`` when its signatures make it the next one after ``trusted`` (None: a first root, signed
    by a threshold of its own root keys); BundleRefused with its kind otherwise. Expiry is not judged here."""
    new = parse_root(data, source)
    if trusted is not None:
        if new.version <= trusted.version:
            raise BundleRefused(source, f"root version {new.version} is not above version {trusted.version} "
                                        f"trusted", kind=KIND_ROLLBACK)
        if new.version != trusted.version + 1:
            raise BundleRefused(source, f"root version {new.version} skips version {trusted.version + 1} (roots "
                                        f"are taken one version at a time)", kind=KIND_FORMAT)
    keyring = new.keyring_bytes() + (trusted.keyring_bytes() if trusted is not None else b"")
    with tempfile.TemporaryDirectory(prefix="gpuguard-root-") as work:
        signers = _signed_by(host, Path(work), data, signature, keyring, source)
    if trusted is not None:
        _require(trusted.root, signers, f"the trusted version {trusted.version}'s", source)
    _require(new.root, signers, f"version {new.version}'s own", source)
    return new


def _bootstrap_problem(host: "Host", keys_dir: str, path: Path) -> Optional[str]:
    """Why the first root in the keys directory cannot be trusted (who can write it can choose every key)."""
    problem = keyring_problem(host, [], keys_dir)
    if problem is not None:
        return problem
    info = os.stat(path)
    if info.st_uid not in (0, os.geteuid()) or info.st_mode & stat.S_IWOTH or (
            info.st_mode & stat.S_IWGRP and info.st_gid != 0):
        return f"{path} may be written by others than root (mode {stat.S_IMODE(info.st_mode):04o}, uid {info.st_uid})"
    return None


class RootStore:
    """The trusted root of one state directory under one Host (callers hold the bundle directory's lock)."""

    def __init__(self, host: "Host", state_dir: str, keys_dir: str) -> None:
        self.host = host
        self.keys_dir = keys_dir
        self.path = host.path(StatePaths(state_dir).policy_root)
        self.signature_path = self.path.with_name(self.path.name + ".sig")

    def trusted(self, source: str) -> Optional[RootMetadata]:
        """The root trusted now; the keys directory's first root, checked and kept, when none is yet; None when
        there is neither (then the keyrings of agent/bundle/verify.py decide, with no roles)."""
        try:
            return parse_root(read_bytes_bounded(str(self.path), MAX_ROOT_BYTES), str(self.path))
        except FileMissing:
            pass
        except InputFileError as exc:
            raise BundleRefused(source, f"the trusted root cannot be read: {exc}", kind=KIND_FORMAT) from None
        first = self.host.path(self.keys_dir) / ROOT_FILE_NAME
        if not first.exists():
            return None
        problem = _bootstrap_problem(self.host, self.keys_dir, first)
        if problem is not None:
            raise BundleRefused(source, f"first root: {problem}", kind=KIND_SIGNATURE)
        data, signature = self._read_pair(first)
        root = accept_root(self.host, None, data, signature, str(first))
        self._keep(data, signature)
        return root

    def walk(self, chain: Sequence[Tuple[bytes, bytes]], now: dt.datetime, source: str) -> RootMetadata:
        """Take each root of ``chain`` (bytes and signatures, versions N+1, N+2, ...) in turn after the trusted one
        (the first root when none is trusted yet), keeping each as it is taken; the root trusted at the end, which
        must not have expired."""
        if len(chain) > MAX_ROOT_ROTATIONS:
            raise BundleRefused(source, f"{len(chain)} roots in one walk, more than {MAX_ROOT_ROTATIONS}",
                                kind=KIND_FORMAT)
        trusted = self.trusted(source)
        for data, signature in chain:
            trusted = accept_root(self.host, trusted, data, signature, source)
            self._keep(data, signature)
        if trusted is None:
            raise BundleRefused(source, "no root given and none trusted", kind=KIND_FORMAT)
        if now >= trusted.expires_at:
            raise BundleRefused(source, f"root version {trusted.version} expired at {trusted.expires}",
                                kind=KIND_EXPIRED)
        return trusted

    def _read_pair(self, path: Path) -> Tuple[bytes, bytes]:
        return (read_bytes_bounded(str(path), MAX_ROOT_BYTES),
                read_bytes_bounded(str(path) + ".sig", MAX_SIGNATURES_BYTES))

    def _keep(self, data: bytes, signature: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomically(str(self.signature_path), signature)
        write_bytes_atomically(str(self.path), data)
