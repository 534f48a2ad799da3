"""A hashed copy of a CA file for the lean child's cheap trust load (issue #45).

Loading a public-sized CA bundle (certifi's, 118 certificates) into a TLS context costs about 12.6 ms of CPU, and the
stdlib-only lean child (agent/daemon_jobs/lean_child.py) did it on every heartbeat. A ``c_rehash``-style directory
costs about 0.1 ms: OpenSSL's by-directory lookup opens only the ``<subject hash>.<n>`` files of the issuers a
verification asks for. The full children that hand the lean child its plans (the policy fetch: HubProbePlan; the
delivery: DeliveryPlan) make sure such a directory exists for the plan's CA file:

    <state_dir>/tls-anchors/<sha256 of the CA file>/<hash>.<n>     one PEM certificate each, n counting collisions

It holds exactly the file's certificates (never more trust than the file); a file with anything but CERTIFICATE
blocks (a TRUSTED CERTIFICATE's usage limits, a CRL) gets none. It is built in a dot-named sibling and renamed into
place, so a killed build never leaves a half directory under the name a plan names; a directory whose files are not
what they should be is rebuilt; the least recently used beyond :data:`KEEP_DIRECTORIES` are removed. The plan carries
the directory and the CA file's stamp (device, inode, size, mtime in ns) it was built from: the lean child uses the
directory only while the file's stat still matches, and the whole file after a verification failure through it
(agent/daemon_jobs/hub_probe.py, ``Trust``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import stat
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from agent.errors import GpuguardError, InputFileError
from agent.files import read_bytes_bounded, remove_flat_directory, write_bytes_atomically
from agent.report.x509_subject import subject_hash
from agent.statepaths import StatePaths

# The largest CA file copied (the system bundle is about 220 kB; certifi's 235 kB).
MAX_CA_FILE_BYTES = 4 << 20
# Directories of other (older) CA files kept beside the ones in use: two plans may name two files.
KEEP_DIRECTORIES = 4
# A dot-named build directory older than this is one a killed child left: removed by the next build.
STALE_BUILD_SECONDS = 600
_BUILD_PREFIX = ".build-"
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n(.*?)-----END \1-----", re.S)
_PEM_BEGIN = re.compile(rb"-----BEGIN ")

# (device, inode, size, mtime in ns) of the CA file.
Stamp = Tuple[int, int, int, int]


@dataclass(frozen=True)
class Anchors:
    """A built directory and the stamp of the CA file it holds the certificates of."""

    directory: str
    stamp: Stamp


def file_stamp(info: os.stat_result) -> Stamp:
    """The stamp the lean child compares with one stat call."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def hashed_files(ca_file: str, data: bytes) -> Optional[Dict[str, bytes]]:
    """``<hash>.<n>`` -> one certificate's PEM, for every distinct certificate of the file in its order; None when
    the file holds a PEM block that is not a CERTIFICATE or no certificate at all; CertificateInvalid (an
    InputFileError) for a block that is not base64 DER of a certificate. Pure."""
    blocks = _PEM_BLOCK.findall(data)
    if not blocks or len(blocks) != len(_PEM_BEGIN.findall(data)) \
            or any(label != b"CERTIFICATE" for label, _ in blocks):
        return None
    files: Dict[str, bytes] = {}
    seen = set()
    counts: Dict[str, int] = {}
    for index, (_, body) in enumerate(blocks, 1):
        source = f"{ca_file}: certificate {index}"
        try:
            der = base64.b64decode(b"".join(body.split()), validate=True)
        except binascii.Error:
            raise InputFileError(source, "not base64") from None
        if der in seen:  # c_rehash links one copy of a certificate listed twice
            continue
        seen.add(der)
        name = subject_hash(der, source)
        number = counts.get(name, 0)
        counts[name] = number + 1
        lines = [base64.b64encode(der[at:at + 48]) for at in range(0, len(der), 48)]
        files[f"{name}.{number}"] = b"-----BEGIN CERTIFICATE-----\n" + b"\n".join(lines) + \
            b"\n-----END CERTIFICATE-----\n"
    return files


def _matches(directory: str, files: Dict[str, bytes]) -> bool:
    """Whether ``directory`` holds exactly ``files`` (a truncated, removed or added file: rebuilt)."""
    try:
        if sorted(os.listdir(directory)) != sorted(files):
            return False
        return all(read_bytes_bounded(os.path.join(directory, name), len(data)) == data
                   for name, data in files.items())
    except (OSError, InputFileError):
        return False


def _prune(root: str, keep: str, now_seconds: float) -> None:
    """Remove stale build directories and the least recently used directories beyond KEEP_DIRECTORIES."""
    kept: List[Tuple[float, str]] = []
    with os.scandir(root) as entries:
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            age_seconds = now_seconds - entry.stat(follow_symlinks=False).st_mtime
            if entry.name.startswith(_BUILD_PREFIX):
                if age_seconds > STALE_BUILD_SECONDS:
                    remove_flat_directory(entry.path)
            elif entry.name != keep:
                kept.append((age_seconds, entry.path))
    for _, path in sorted(kept)[KEEP_DIRECTORIES - 1:]:
        remove_flat_directory(path)


def ensure_anchors(ca_file: Optional[str], anchors_root: str) -> Optional[Anchors]:
    """The directory for ``ca_file`` under ``anchors_root``, built or repaired when needed; None where none helps
    (no file, a ``c_rehash``ed directory already, a file changed while read, blocks other than certificates).
    GpuguardError or OSError when it cannot be read or built."""
    if not ca_file:
        return None
    before = os.stat(ca_file)
    if not stat.S_ISREG(before.st_mode):
        return None
    data = read_bytes_bounded(ca_file, MAX_CA_FILE_BYTES)
    after = os.stat(ca_file)
    if file_stamp(before) != file_stamp(after):
        return None  # rewritten while read: the next full child builds it
    files = hashed_files(ca_file, data)
    if files is None:
        return None
    name = hashlib.sha256(data).hexdigest()
    directory = os.path.join(anchors_root, name)
    os.makedirs(anchors_root, mode=0o755, exist_ok=True)
    if not _matches(directory, files):
        build = os.path.join(anchors_root, f"{_BUILD_PREFIX}{name[:16]}-{os.getpid()}-{os.urandom(4).hex()}")
        os.mkdir(build, 0o755)
        try:
            for file_name, pem in files.items():
                write_bytes_atomically(os.path.join(build, file_name), pem, mode=0o644)
            if os.path.isdir(directory):  # damaged: moved out of the way, then the whole one renamed in
                damaged = build + ".damaged"
                os.rename(directory, damaged)
                remove_flat_directory(damaged)
            os.rename(build, directory)
        finally:
            remove_flat_directory(build)  # gone after the rename; what a failed build wrote
    os.utime(directory)  # the least recently used are pruned
    _prune(anchors_root, name, time.time())
    return Anchors(directory=directory, stamp=file_stamp(after))


def plan_anchors(url: str, ca_file: Optional[str], state_dir: str) -> Tuple[Optional[str], Optional[Stamp]]:
    """A plan's ``ca_anchor_dir`` and ``ca_file_stamp`` for its ``url``: :func:`ensure_anchors` under the state
    directory's tls-anchors/ for an HTTPS endpoint; ``(None, None)`` for plain HTTP, where none helps, and where it
    fails (logged, ``tls_anchors_not_built``): the lean child loads the whole file then, as before."""
    if not url.startswith("https:"):
        return None, None
    try:
        anchors = ensure_anchors(ca_file, StatePaths(state_dir).tls_anchors)
    except (GpuguardError, OSError) as exc:
        from agent.log import get_logger

        get_logger("report.tls_anchors").warning("tls_anchors_not_built", ca_file=ca_file, error=str(exc),
                                                 then="the lean child loads the whole CA file")
        return None, None
    return (None, None) if anchors is None else (anchors.directory, anchors.stamp)
