"""A bundle's detached OpenPGP signature, checked with gpgv against the operator's trusted keyrings.

Why gpgv: it is on every apt host (apt depends on it) and in gnupg2 on RHEL, operators already audit apt
repositories this way, and it adds no Python dependency. The trusted keys are binary keyrings
``/etc/gpuguard/keys/*.gpg`` (as ``/etc/apt/trusted.gpg.d``), each passed with ``--keyring``: a key rotates by
adding one file and, once every bundle is signed by the new key, removing the old one. gpgv runs through the Host's
runner, never on the apt/dnf hot path. :func:`parse_gpgv_status` (pure) reads its ``[GNUPG:]`` status lines: a
signature is good only with exactly one VALIDSIG and no BADSIG, ERRSIG, EXPSIG, EXPKEYSIG, REVKEYSIG, NO_PUBKEY
or NODATA, and gpgv's exit 0; SHA-1 (and weaker) signatures are refused (``--weak-digest SHA1``).

Whoever can write a keyring can sign any policy, so the keys are refused, each with a line naming the file, unless
the keys directory, the directories above it (within the Host's root), every keyring and every directory on the way
to it with symlinks resolved (a keyring linked into a world-writable directory is refused) are owned by root (or by
the user the agent runs as) and writable by no one else (group-writable only for group root), and unless every
keyring is a binary OpenPGP keyring (gpgv refuses every signature when one ``--keyring`` is armored or damaged,
saying only that no key was found).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

from agent.defaults import DEFAULT_KEYS_DIR
from agent.errors import BundleRefused, CommandError, InputFileError
from agent.files import read_bytes_bounded

if TYPE_CHECKING:  # pragma: no cover
    from agent.host import Host

GPGV_TIMEOUT_SECONDS = 30.0
STATUS_PREFIX = "[GNUPG:] "
# Each status word that refuses a signature, and how the refusal says it.
_REFUSING = {
    "BADSIG": "bad signature (the bundle or the signature was changed) from key {0}",
    "EXPSIG": "the signature by key {0} has expired",
    "EXPKEYSIG": "key {0} has expired",
    "REVKEYSIG": "key {0} is revoked",
    "NO_PUBKEY": "signed by key {0}, which no trusted keyring holds",
    "ERRSIG": "the signature by key {0} cannot be checked",
    "NODATA": "the signature file holds no OpenPGP signature",
}
_ORDER = ("BADSIG", "REVKEYSIG", "EXPKEYSIG", "EXPSIG", "NO_PUBKEY", "ERRSIG", "NODATA")
# ERRSIG's return code 5: gpgv refused the digest algorithm (--weak-digest).
_WEAK_DIGEST_RC = "5"
# The first byte of a binary keyring: a public-key packet (tag 6), old format (any length type) or new format.
_PUBLIC_KEY_PACKET = frozenset({0x98, 0x99, 0x9A, 0x9B, 0xC6})


@dataclass(frozen=True)
class SignatureVerdict:
    """What gpgv said: the signing key's primary fingerprint when good, else the one-line refusal."""

    fingerprint: Optional[str] = None
    refusal: Optional[str] = None


def parse_gpgv_status(text: str, returncode: int) -> SignatureVerdict:
    """Judge gpgv's ``--status-fd`` output and exit status (pure)."""
    words: dict = {}
    valid: List[List[str]] = []
    for line in text.splitlines():
        if not line.startswith(STATUS_PREFIX):
            continue
        fields = line[len(STATUS_PREFIX):].split()
        if not fields:
            continue
        if fields[0] == "VALIDSIG":
            valid.append(fields[1:])
        elif fields[0] in _REFUSING:
            words.setdefault(fields[0], fields[1] if len(fields) > 1 else "?")
            if fields[0] == "ERRSIG" and len(fields) > 6 and fields[6] == _WEAK_DIGEST_RC:
                words.setdefault("weak", fields[1])
    for word in _ORDER:
        if word in words:
            if word == "ERRSIG" and "weak" in words:
                return SignatureVerdict(refusal=f"the signature by key {words['weak']} uses a refused digest "
                                                f"algorithm (SHA-1 or weaker: sign with SHA-256 or better)")
            return SignatureVerdict(refusal=_REFUSING[word].format(words[word]))
    if len(valid) != 1:
        found = "no valid signature" if not valid else f"{len(valid)} signatures (exactly one is accepted)"
        return SignatureVerdict(refusal=f"{found} (gpgv exit {returncode})")
    if returncode != 0:
        return SignatureVerdict(refusal=f"gpgv exit {returncode}")
    fields = valid[0]
    # VALIDSIG <fpr> <date> <ts> <expire> <ver> <reserved> <algo> <hash> <class> [<primary-key-fpr>]
    fingerprint = fields[9] if len(fields) >= 10 else fields[0] if fields else ""
    if not fingerprint:
        return SignatureVerdict(refusal="gpgv gave a VALIDSIG without a fingerprint")
    return SignatureVerdict(fingerprint=fingerprint)


def _unsafe(path: Path, what: str, above: bool = False) -> Optional[str]:
    """Why ``path`` (followed through links) cannot be trusted to hold keys; None when it can. A directory
    ``above`` the one holding keys may be root's and world-writable with the sticky bit (``/tmp``): no one else can
    rename or remove what is in it."""
    try:
        info = os.stat(path)
    except OSError as exc:
        return f"{what} {path} cannot be read: {exc.strerror}"
    if info.st_uid not in (0, os.geteuid()):
        return f"{what} {path} is owned by uid {info.st_uid}, not root (whoever owns it can add a key)"
    if above and info.st_uid == 0 and info.st_mode & stat.S_ISVTX:
        return None
    writable = info.st_mode & stat.S_IWOTH or (info.st_mode & stat.S_IWGRP and info.st_gid != 0)
    if writable:
        return (f"{what} {path} is writable by others (mode {stat.S_IMODE(info.st_mode):04o}: anyone who can "
                f"write there can add a key; chmod go-w it)")
    return None


def _unsafe_directories(host: "Host", start: Path, first: str) -> Optional[str]:
    """Why ``start`` or a directory above it cannot be trusted, up to the Host's root (or ``/`` for a path outside
    it); None when none is unsafe. ``first`` names ``start`` in the line."""
    for above in [start, *start.parents]:
        # The Host's root is a string (issue #45); a path outside it stops at /.
        if str(above) == str(host.root) or above == Path(above.anchor):
            break
        problem = _unsafe(above, first, False) if above == start else _unsafe(above, "directory", True)
        if problem is not None:
            return problem
    return None


def keyring_problem(host: "Host", keyrings: List[str], keys_dir: str = DEFAULT_KEYS_DIR) -> Optional[str]:
    """The first reason the trusted keys cannot be used as they are (one line naming the file); None when they can.
    Every directory on the way to the keys directory and to each keyring is checked twice: as written (whoever can
    write the directory holding a link can change where it points) and with every link resolved (whoever can write
    the directory a link leads to can replace the keyring in it)."""
    directory = host.path(keys_dir)
    problem = _unsafe_directories(host, directory, "keys directory")
    if problem is None and Path(os.path.realpath(directory)) != directory:
        problem = _unsafe_directories(host, Path(os.path.realpath(directory)), "keys directory (resolved)")
    if problem is not None:
        return problem
    for keyring in keyrings:
        problem = _unsafe(Path(keyring), "keyring")
        resolved = Path(os.path.realpath(keyring))
        if problem is None and resolved.parent != directory:
            problem = _unsafe_directories(host, resolved.parent, f"directory of keyring {keyring} ->")
        if problem is not None:
            return problem
        try:  # a FIFO in place of a keyring is refused at once, not waited on
            first = read_bytes_bounded(keyring)[:1]
        except InputFileError as exc:
            return f"keyring {keyring} cannot be read: {exc.reason}"
        if not first or first[0] not in _PUBLIC_KEY_PACKET:
            kind = "empty" if not first else "armored (gpg --dearmor it)" if first == b"-" else "not a key"
            return f"keyring {keyring} is not a binary OpenPGP keyring ({kind}); gpgv would trust no key at all"
    return None


def trusted_keyrings(host: "Host", keys_dir: str = DEFAULT_KEYS_DIR) -> List[str]:
    """The real paths of the trusted keyrings (``*.gpg`` under ``keys_dir`` under the Host's root), sorted."""
    directory = host.path(keys_dir)
    try:
        names = sorted(p.name for p in directory.iterdir() if p.suffix == ".gpg" and p.is_file())
    except OSError:
        return []
    return [str(directory / name) for name in names]


def verify_signature(host: "Host", bundle_path: str, signature_path: str, keys_dir: str = DEFAULT_KEYS_DIR,
                     source: Optional[str] = None) -> str:
    """The primary fingerprint of the trusted key that signed ``bundle_path`` (real paths); BundleRefused (one
    line naming why) otherwise."""
    source = source or bundle_path
    keyrings = trusted_keyrings(host, keys_dir)
    if not keyrings:
        raise BundleRefused(source, f"no trusted key in {keys_dir} (install the signers' keyrings as *.gpg there)",
                             "signature")
    problem = keyring_problem(host, keyrings, keys_dir)
    if problem is not None:
        raise BundleRefused(source, f"trusted keys: {problem}", "signature")
    argv = ["gpgv", "--status-fd", "1", "--weak-digest", "SHA1", "--weak-digest", "RIPEMD160"]
    for keyring in keyrings:
        argv += ["--keyring", keyring]
    argv += [signature_path, bundle_path]
    try:
        result = host.run(argv, GPGV_TIMEOUT_SECONDS)
    except CommandError as exc:
        raise BundleRefused(source, f"the signature cannot be checked: {exc.reason}", "signature") from None
    verdict = parse_gpgv_status(result.stdout, result.returncode)
    if verdict.refusal is not None:
        raise BundleRefused(source, f"signature: {verdict.refusal}", "signature")
    assert verdict.fingerprint is not None
    return verdict.fingerprint
