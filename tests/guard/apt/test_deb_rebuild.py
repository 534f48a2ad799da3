"""Rebuilding an installed package's .deb from a fake dpkg database: control data, file list, checksums, exactness."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Dict, Tuple

import pytest

from agent import log
from agent.guard.apt.deb_cache import DebCache
from agent.guard.apt.deb_rebuild import (
    DebRebuilder,
    ar_header,
    control_paragraph,
    parse_diversions,
    parse_md5sums,
)
from agent.guard.apt.tool import AptTool
from agent.guard.rollback.kept import Manifest
from agent.host import Host
from tests.fakes.runner import FakeRunner

pytestmark = pytest.mark.timeout(60)

VERSION = "1:580.95.05-0ubuntu0.24.04.2"
CONF_MD5 = hashlib.md5(b"threads=4\n").hexdigest()
STANZA = f"""Package: libnvidia-compute-580
Status: install ok installed
Priority: optional
Section: libs
Installed-Size: 12
Maintainer: Ubuntu Core Developers <ubuntu-devel-discuss@lists.ubuntu.com>
Architecture: amd64
Multi-Arch: same
Version: {VERSION}
Depends: libc6 (>= 2.34)
Conffiles:
 /etc/nvidia/compute.conf {CONF_MD5}
 /etc/nvidia/old.conf 0123456789abcdef0123456789abcdef obsolete
Description: NVIDIA libcompute package
 A second line of the description.
"""
FILES = {"/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05": b"\x7fELF cuda" * 100,
         "/usr/share/doc/libnvidia-compute-580/copyright": b"copyright\n"}


def _root(tmp_path: Path) -> Tuple[Path, Host]:
    """A root where dpkg installed libnvidia-compute-580 (Multi-Arch: same, so its info files carry :amd64)."""
    root = tmp_path / "root"
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("Package: other\nStatus: install ok installed\nVersion: 1\n\n" + STANZA)
    for path, content in FILES.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_bytes(content)
    (root / "etc/nvidia").mkdir(parents=True)
    (root / "etc/nvidia/compute.conf").write_text("threads=4\n")
    os.symlink("libcuda.so.580.95.05", root / "usr/lib/x86_64-linux-gnu/libcuda.so.1")
    listed = ["/.", "/etc", "/etc/nvidia", "/etc/nvidia/compute.conf", "/usr", "/usr/lib",
              "/usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", *FILES,
              "/usr/share", "/usr/share/doc", "/usr/share/doc/libnvidia-compute-580"]
    prefix = info / "libnvidia-compute-580:amd64"
    Path(f"{prefix}.list").write_text("\n".join(listed) + "\n")
    Path(f"{prefix}.md5sums").write_text("".join(f"{hashlib.md5(c).hexdigest()}  {p.lstrip('/')}\n"
                                                 for p, c in FILES.items()))
    Path(f"{prefix}.conffiles").write_text("/etc/nvidia/compute.conf\n")
    Path(f"{prefix}.postinst").write_text("#!/bin/sh\nldconfig\n")
    Path(f"{prefix}.triggers").write_text("activate-noawait ldconfig\n")
    return root, Host(root=root, runner=FakeRunner())


def _members(deb: Path) -> Dict[str, bytes]:
    """The ar members of a .deb, read by hand (name -> bytes)."""
    data = deb.read_bytes()
    assert data[:8] == b"!<arch>\n"
    out, at = {}, 8
    while at < len(data):
        header = data[at:at + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        out[name] = data[at + 60:at + 60 + size]
        at += 60 + size + size % 2
    return out


def _tar(blob: bytes) -> tarfile.TarFile:
    return tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob)))


def test_pure_parsers_read_dpkg_formats() -> None:
    """md5sums, diversions and the status stanza are read as dpkg writes them; install-only fields are dropped."""
    assert parse_md5sums("d41d8cd98f00b204e9800998ecf8427e  usr/bin/x\n") == {
        "/usr/bin/x": "d41d8cd98f00b204e9800998ecf8427e"}
    assert parse_diversions("/usr/bin/a\n/usr/bin/a.real\npkg\n") == {"/usr/bin/a": ("/usr/bin/a.real", "pkg")}
    stanza = control_paragraph(STANZA)
    assert "Status:" not in stanza.control and "Conffiles:" not in stanza.control
    assert " A second line of the description." in stanza.control and stanza.control.endswith("\n")
    assert list(stanza.conffiles) == ["/etc/nvidia/compute.conf"]  # the obsolete one is not shipped
    assert len(ar_header("control.tar.gz", 10, 0)) == 60


def test_rebuild_is_exact_with_the_listed_files_control_and_scripts(tmp_path: Path) -> None:
    """An untouched package rebuilds exactly: every listed path, dpkg's md5sums, the scripts and the control data."""
    root, host = _root(tmp_path)
    rebuilt = DebRebuilder(host).rebuild("libnvidia-compute-580", VERSION, "amd64", "/var/lib/gpuguard/debs/x.deb")
    assert rebuilt is not None and rebuilt.exact and not rebuilt.conffiles_edited
    members = _members(root / "var/lib/gpuguard/debs/x.deb")
    assert list(members) == ["debian-binary", "control.tar.gz", "data.tar.gz"]
    assert members["debian-binary"] == b"2.0\n"
    control = _tar(members["control.tar.gz"])
    names = sorted(control.getnames())
    assert names == [".", "./conffiles", "./control", "./md5sums", "./postinst", "./triggers"]
    assert control.getmember("./postinst").mode == 0o755
    text = control.extractfile("./control").read().decode()  # type: ignore[union-attr]
    assert f"Version: {VERSION}" in text and "Status" not in text
    data = _tar(members["data.tar.gz"])
    listed = (root / "var/lib/dpkg/info/libnvidia-compute-580:amd64.list").read_text().split()
    assert sorted("/." if m.name == "." else m.name[1:] for m in data) == sorted(listed)
    link = data.getmember("./usr/lib/x86_64-linux-gnu/libcuda.so.1")
    assert link.issym() and link.linkname == "libcuda.so.580.95.05"
    for path, content in FILES.items():
        assert data.extractfile("." + path).read() == content  # type: ignore[union-attr]


def test_changed_and_missing_files_make_it_inexact_and_an_edited_conffile_is_carried(tmp_path: Path) -> None:
    """A file changed or gone since installation is named and the package is inexact; an operator's conffile edit
    is kept in the package and reported, without making it inexact."""
    root, host = _root(tmp_path)
    (root / "usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05").write_bytes(b"patched")
    (root / "usr/share/doc/libnvidia-compute-580/copyright").unlink()
    (root / "etc/nvidia/compute.conf").write_text("threads=64\n")
    rebuilt = DebRebuilder(host).rebuild("libnvidia-compute-580", VERSION, "amd64", "/d/x.deb")
    assert rebuilt is not None and not rebuilt.exact
    assert rebuilt.changed == ("/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",)
    assert rebuilt.missing == ("/usr/share/doc/libnvidia-compute-580/copyright",)
    assert rebuilt.conffiles_edited == ("/etc/nvidia/compute.conf",)
    data = _tar(_members(root / "d/x.deb")["data.tar.gz"])
    assert data.extractfile("./etc/nvidia/compute.conf").read() == b"threads=64\n"  # type: ignore[union-attr]


def test_a_version_dpkg_does_not_have_is_not_rebuilt(tmp_path: Path) -> None:
    """Only exactly the installed version is rebuilt: another version gives None and writes nothing."""
    root, host = _root(tmp_path)
    assert DebRebuilder(host).rebuild("libnvidia-compute-580", "1:580.105.08-1", "amd64", "/d/x.deb") is None
    assert not (root / "d/x.deb").exists()


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")
def test_dpkg_deb_reads_the_rebuilt_package(tmp_path: Path) -> None:
    """dpkg-deb itself accepts the archive: its fields and its contents."""
    root, host = _root(tmp_path)
    DebRebuilder(host).rebuild("libnvidia-compute-580", VERSION, "amd64", "/d/x.deb")
    deb = str(root / "d/x.deb")
    field = subprocess.run(["dpkg-deb", "-f", deb, "Version"], capture_output=True, text=True, timeout=30)
    assert field.returncode == 0 and field.stdout.strip() == VERSION, field.stderr
    contents = subprocess.run(["dpkg-deb", "-c", deb], capture_output=True, text=True, timeout=30)
    assert contents.returncode == 0 and "./usr/lib/x86_64-linux-gnu/libcuda.so.1 -> libcuda.so.580.95.05" \
        in contents.stdout, contents.stderr


def test_cache_rebuilds_when_no_repository_offers_it_and_logs_a_miss_once_per_version(tmp_path: Path) -> None:
    """No archive copy and apt-get download fails: the kept file is rebuilt (source 'rebuilt'); a version that
    cannot be had at all is logged on the first check only, not on every check."""
    root, host = _root(tmp_path)
    runner = FakeRunner()
    host = Host(root=root, runner=runner)
    tool = AptTool(host)
    cache = DebCache(host, "/var/lib/gpuguard/debs", tool)
    for version in (VERSION, "2.0-1"):
        for name in ("libnvidia-compute-580", "cuda-cudart-13-0"):
            runner.add(tool._download_argv(name, version, cache.directory), returncode=100,
                       stderr=f"E: Can't find a source to download version '{version}' of '{name}'")
    manifest = Manifest()
    kept = cache.ensure("libnvidia-compute-580", VERSION, "amd64", manifest)
    assert kept.source == "rebuilt" and kept.path == cache.path("libnvidia-compute-580", VERSION, "amd64")
    stream = io.StringIO()
    log.configure("info", json_output=True, stream=stream)
    try:
        for _ in range(3):
            manifest.save(host, cache.directory)
            again = Manifest.load(host, cache.directory)
            assert cache.ensure("cuda-cudart-13-0", "2.0-1", "amd64", again).path is None
            assert cache.ensure("libnvidia-compute-580", VERSION, "amd64", again).source == "rebuilt"
            manifest = again
    finally:
        log.configure("info")
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["event"] for e in events if e["package"] == "cuda-cudart-13-0"] == ["package_file_miss"]
