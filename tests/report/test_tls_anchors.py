"""The hashed copy of a CA file (agent/report/tls_anchors.py, issue #45): the names ``openssl rehash`` gives the
same certificates, only the file's certificates, never a half-built directory under the name a plan uses, a damaged
copy rebuilt, old copies pruned."""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.report.tls_anchors import KEEP_DIRECTORIES, ensure_anchors, file_stamp, hashed_files
from tests.needs import unavailable

_PEM = re.compile(r"-----BEGIN CERTIFICATE-----\n.*?-----END CERTIFICATE-----\n", re.S)


def public_bundle() -> Path:
    """certifi's cacert.pem: 100+ certificates, as requests' default trust."""
    certifi = pytest.importorskip("certifi")
    return Path(certifi.where())


def test_the_directory_has_the_names_openssl_rehash_gives_and_only_the_files_certificates(tmp_path: Path) -> None:
    """Every certificate of certifi's bundle is one ``<hash>.<n>`` file, the set of names is what ``openssl
    rehash`` makes of the same certificates, and each file holds a certificate of the bundle."""
    if shutil.which("openssl") is None:
        unavailable("the rehash comparison", "no openssl command")
    bundle = public_bundle()
    anchors = ensure_anchors(str(bundle), str(tmp_path / "anchors"))
    assert anchors is not None and anchors.stamp == file_stamp(os.stat(bundle))
    split = tmp_path / "split"
    split.mkdir()
    blocks = _PEM.findall(bundle.read_text(encoding="ascii"))
    for index, block in enumerate(blocks):
        (split / f"cert{index}.pem").write_text(block, encoding="ascii")
    subprocess.run(["openssl", "rehash", str(split)], check=True, capture_output=True, timeout=60)
    rehashed = sorted(p.name for p in split.iterdir() if p.is_symlink())
    assert sorted(os.listdir(anchors.directory)) == rehashed
    originals = {base64.b64decode("".join(b.splitlines()[1:-1])) for b in blocks}
    for name in rehashed:
        (block,) = _PEM.findall((Path(anchors.directory) / name).read_text(encoding="ascii"))
        assert base64.b64decode("".join(block.splitlines()[1:-1])) in originals


@pytest.mark.parametrize("extra", [b"-----BEGIN TRUSTED CERTIFICATE-----\nAAAA\n-----END TRUSTED CERTIFICATE-----\n",
                                   b"-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n",
                                   b"-----BEGIN CERTIFICATE-----\nAAAA\n"])
def test_a_file_with_anything_but_whole_certificate_blocks_gets_no_directory(tmp_path: Path, extra: bytes) -> None:
    """A trusted certificate (its usage limits would be lost), a CRL or a block cut short: no directory, the lean
    child loads the whole file as before."""
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(public_bundle().read_bytes() + extra)
    assert hashed_files(str(ca_file), ca_file.read_bytes()) is None
    assert ensure_anchors(str(ca_file), str(tmp_path / "anchors")) is None
    assert not (tmp_path / "anchors").exists()


def test_a_directory_or_no_file_gets_no_directory(tmp_path: Path) -> None:
    """A ``c_rehash``ed directory (used as it is) and no CA file at all need no copy."""
    assert ensure_anchors(str(tmp_path), str(tmp_path / "anchors")) is None
    assert ensure_anchors(None, str(tmp_path / "anchors")) is None


_KILLED_BUILD = r"""
import os, signal, sys
import agent.report.tls_anchors as anchors
written = []
real = anchors.write_bytes_atomically
def write_then_die(path, data, mode=0o600):
    real(path, data, mode)
    written.append(path)
    if len(written) == 10:
        os.kill(os.getpid(), signal.SIGKILL)
anchors.write_bytes_atomically = write_then_die
anchors.ensure_anchors(sys.argv[1], sys.argv[2])
"""


def test_a_killed_build_leaves_no_directory_under_the_name_and_the_next_build_makes_it(tmp_path: Path) -> None:
    """A child killed (SIGKILL) in the middle of a build leaves only a dot-named build directory, never the
    ``<sha256>`` one a plan names; the next build makes the whole one and a stale leftover is removed later."""
    bundle, root = public_bundle(), tmp_path / "anchors"
    done = subprocess.run([sys.executable, "-c", _KILLED_BUILD, str(bundle), str(root)], capture_output=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2], check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    (leftover,) = list(root.iterdir())
    assert leftover.name.startswith(".build-") and len(list(leftover.iterdir())) == 10
    anchors = ensure_anchors(str(bundle), str(root))
    assert anchors is not None and len(os.listdir(anchors.directory)) > 100
    assert leftover.exists()  # another child's build may be under way: only an old one is removed
    os.utime(leftover, (0, 0))
    ensure_anchors(str(bundle), str(root))
    assert sorted(p.name for p in root.iterdir()) == [os.path.basename(anchors.directory)]


@pytest.mark.parametrize("damage", ["truncated", "removed", "added"])
def test_a_damaged_directory_is_rebuilt_by_the_next_full_child(tmp_path: Path, damage: str) -> None:
    """A hash file truncated, removed, or a file added: the next build puts back exactly the file's certificates."""
    bundle = public_bundle()
    anchors = ensure_anchors(str(bundle), str(tmp_path / "anchors"))
    assert anchors is not None
    names = sorted(os.listdir(anchors.directory))
    first = Path(anchors.directory) / names[0]
    whole = first.read_bytes()
    if damage == "truncated":
        first.write_bytes(whole[:40])
    elif damage == "removed":
        first.unlink()
    else:
        (Path(anchors.directory) / "ffffffff.0").write_bytes(whole)
    again = ensure_anchors(str(bundle), str(tmp_path / "anchors"))
    assert again == anchors
    assert sorted(os.listdir(anchors.directory)) == names and first.read_bytes() == whole


def test_old_directories_beyond_the_kept_number_are_pruned(tmp_path: Path) -> None:
    """Each new CA file content gets its own directory; only the KEEP_DIRECTORIES most recently used stay."""
    ca_file = tmp_path / "ca.pem"
    blocks = _PEM.findall(public_bundle().read_text(encoding="ascii"))
    built = []
    for count in range(1, KEEP_DIRECTORIES + 3):
        ca_file.write_text("".join(blocks[:count]), encoding="ascii")
        anchors = ensure_anchors(str(ca_file), str(tmp_path / "anchors"))
        assert anchors is not None
        built.append(os.path.basename(anchors.directory))
        os.utime(anchors.directory, (count, count))  # used in this order, a second apart
    assert sorted(os.listdir(tmp_path / "anchors")) == sorted(built[-KEEP_DIRECTORIES:])
