"""A Debian 13 (trixie) chroot holding Debian's own ROCm and CUDA packages, for the guard's real-apt tests of GPU
packages as the distribution ships them (tests/guard/apt/chroot/test_distribution_gpu.py).

The root is ``debootstrap --variant=minbase --include=python3 trixie``. Its apt then reads two local repositories
made from the archive's packages, ``/srv/trixie`` (Suite trixie) and ``/srv/sid`` (Suite sid), with
``APT::Default-Release "trixie"``, so ``apt-get install -t sid NAME`` moves to sid's release as on a host with both
suites in its sources. Small packages are the archive's own .debs, downloaded once with ``apt-get download``;
the heavy libraries (librocblas0 is 160 MB to download and 2.2 GB installed, libcublas12 with libcublaslt12 is
224 MB) are stand-ins built from the archive's own control stanza (name, version, architecture, Multi-Arch,
Depends) with one small file as payload: dpkg and apt resolve them exactly as the real ones.

Locally the finished root (packages downloaded, nothing installed) is kept as a tarball under
/var/tmp/gpuguard-test-cache keyed by a hash of its inputs; in CI (CI=true) it is built from scratch each run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Dict, List, Tuple

from tests.guard.apt.chroot.harness import CACHE_DIR, Chroot, debian_mirror, run

SUITE = "trixie"
HARNESS_VERSION = 2  # bump when the build steps or the package lists change
# (suite, package=version): the archive's own .debs, with what they need beyond minbase (names as of 2026-12-06)
REAL: Tuple[Tuple[str, str], ...] = (
    ("trixie", "libhsa-runtime64-1=6.1.2-3"), ("trixie", "libhsakmt1=6.2.4+ds-1"),
    ("trixie", "libcudart12=12.4.127~12.4.1-2"),
    ("trixie", "libnuma1"), ("trixie", "libdrm-amdgpu1"), ("trixie", "libdrm2"), ("trixie", "libdrm-common"),
    ("trixie", "libelf1t64"),
    ("sid", "libhsa-runtime64-1=6.4.3+dfsg-5"),
)
# (suite, package=version): stand-ins from the archive's control stanza (the payload is too heavy for a test)
STAND_INS: Tuple[Tuple[str, str], ...] = (
    ("trixie", "libamdhip64-5=5.7.1-6+deb13u1"), ("trixie", "libamd-comgr2=6.0+git20231212.4510c28+dfsg-3+b2"),
    ("trixie", "librocblas0=5.5.1+dfsg-7"),
    ("trixie", "libcublas12=12.4.5.8~12.4.1-2"), ("trixie", "libcublaslt12=12.4.5.8~12.4.1-2"),
    ("sid", "libamdhip64-6=6.4.3-5"), ("sid", "libamd-comgr3=7.0.2+dfsg-3"), ("sid", "librocblas4=6.4.4-4"),
    ("sid", "libroctx64-4"),
)
# Depends that a stand-in drops: the real package needs them at run time only (LLVM for comgr), not to be judged.
DROPPED_DEPENDS = ("libllvm", "libclang-common")
STANZA_FIELDS = ("Package", "Version", "Architecture", "Multi-Arch", "Depends", "Pre-Depends", "Breaks",
                 "Conflicts", "Replaces", "Provides", "Section", "Priority", "Source")
APT_OPTIONS = ("-o", "Acquire::Check-Valid-Until=false", "-o", "Acquire::Languages=none", "-q")


def _cache_key(mirror: str) -> str:
    blob = json.dumps({"suite": SUITE, "mirror": mirror, "real": REAL, "stand_ins": STAND_INS,
                       "harness": HARNESS_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _stanza(chroot: Chroot, spec: str) -> Dict[str, str]:
    """The archive's control stanza of ``name=version`` (or the candidate of ``name``), as apt-cache shows it."""
    shown = chroot.run("apt-cache", *APT_OPTIONS, "show", "--no-all-versions", spec, check=True).stdout
    fields: Dict[str, str] = {}
    key = ""
    for line in shown.split("\n\n")[0].splitlines():
        if line[:1] in (" ", "\t") and key:
            fields[key] += "\n" + line
        elif ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def _stand_in(fields: Dict[str, str], out_dir: Path, work: Path) -> Path:
    """A .deb with the stanza's control fields and one small file (under /usr/share/gpuguard-stand-in)."""
    name, version = fields["Package"], fields["Version"]
    tree = work / f"{name}-{version.replace(':', '_')}"
    (tree / "DEBIAN").mkdir(parents=True)
    payload = tree / "usr/share/gpuguard-stand-in" / name
    payload.mkdir(parents=True)
    (payload / "VERSION").write_text(version + "\n")
    control = []
    for field in STANZA_FIELDS:
        value = fields.get(field)
        if value is None:
            continue
        if field == "Depends":
            kept = [d.strip() for d in value.split(",") if not d.strip().startswith(DROPPED_DEPENDS)]
            value = ", ".join(kept)
        control.append(f"{field}: {value}")
    control += ["Maintainer: gpuguard tests <tests@example.invalid>",
                f"Description: stand-in for Debian's {name} (control fields from the archive)"]
    (tree / "DEBIAN/control").write_text("\n".join(control) + "\n")
    out = out_dir / f"{name}_{version.replace(':', '%3a')}_{fields['Architecture']}.deb"
    run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-b", str(tree), str(out)])
    return out


def _gather(chroot: Chroot, mirror: str, work: Path) -> None:
    """The archive's .debs and stand-ins into /srv/<suite>/pool, fetched through the root's own apt."""
    sources = chroot.root / "etc/apt/sources.list"
    sources.write_text(f"deb {mirror} trixie main contrib non-free\ndeb {mirror} sid main contrib non-free\n")
    chroot.run("apt-get", *APT_OPTIONS, "update", check=True, timeout_seconds=900)
    for suite in ("trixie", "sid"):
        pool = chroot.root / f"srv/{suite}/pool"
        pool.mkdir(parents=True, exist_ok=True)
        specs = [spec for s, spec in REAL if s == suite]
        specs = [spec if "=" in spec else f"{spec}/{suite}" for spec in specs]
        chroot.run("sh", "-c", f"cd /srv/{suite}/pool && apt-get {' '.join(APT_OPTIONS)} download "
                   + " ".join(f"'{spec}'" for spec in specs), check=True, timeout_seconds=900)
        for s, spec in STAND_INS:
            if s == suite:
                _stand_in(_stanza(chroot, spec if "=" in spec else f"{spec}/{suite}"), pool, work)
    sources.write_text("")
    shutil.rmtree(chroot.root / "var/lib/apt/lists", ignore_errors=True)
    (chroot.root / "var/lib/apt/lists/partial").mkdir(parents=True)


def index(chroot: Chroot) -> None:
    """Packages and Release for both local suites, then ``apt-get update``."""
    for suite in ("trixie", "sid"):
        repo = chroot.root / f"srv/{suite}"
        (repo / "Packages").write_text(run(["apt-ftparchive", "packages", "pool"], cwd=str(repo)).stdout)
        release = run(["apt-ftparchive", "-o", f"APT::FTPArchive::Release::Suite={suite}",
                       "-o", f"APT::FTPArchive::Release::Codename={suite}", "release", "."], cwd=str(repo)).stdout
        (repo / "Release").write_text(release)
    chroot.run("apt-get", "update", "-q", check=True)


def build_trixie(target: Path, work: Path, use_cache: bool) -> Dict[str, float]:
    """``target`` made the trixie root with the packages gathered (a kept tarball unpacked, or built and kept)."""
    mirror = debian_mirror()
    tarball = CACHE_DIR / f"trixie-gpu-{_cache_key(mirror)}.tar"
    started = time.monotonic()
    if use_cache and tarball.is_file():
        target.mkdir(parents=True, exist_ok=True)
        run(["tar", "-xf", str(tarball), "-C", str(target), "--numeric-owner"], timeout_seconds=600)
        return {"unpack_cached_seconds": round(time.monotonic() - started, 1)}
    run(["debootstrap", "--variant=minbase", "--include=python3", SUITE, str(target), mirror], timeout_seconds=1200)
    timings = {"debootstrap_seconds": round(time.monotonic() - started, 1)}
    started = time.monotonic()
    chroot = Chroot(target)
    chroot.mount()
    try:
        _gather(chroot, mirror, work)
    finally:
        chroot.unmount()
    timings["gather_seconds"] = round(time.monotonic() - started, 1)
    if use_cache:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".tar.partial")
        run(["tar", "-cf", str(partial), "-C", str(target), "--numeric-owner", "."], timeout_seconds=600)
        partial.replace(tarball)
    return timings


def configure_local_suites(chroot: Chroot) -> None:
    """The root's apt reads only the two local suites, trixie by default (sid only when asked with ``-t sid``)."""
    (chroot.root / "etc/apt/sources.list").write_text(
        "deb [trusted=yes] file:/srv/trixie ./\ndeb [trusted=yes] file:/srv/sid ./\n")
    for extra in (chroot.root / "etc/apt/sources.list.d").glob("*"):
        extra.unlink()
    (chroot.root / "etc/apt/apt.conf.d/90gpuguard-tests").write_text(
        'APT::Install-Recommends "false";\nAcquire::Languages "none";\nAPT::Default-Release "trixie";\n')
    index(chroot)


def pool_files(chroot: Chroot, suite: str) -> List[str]:
    """Chroot paths of the .debs in one local suite."""
    return sorted(f"/srv/{suite}/pool/{p.name}" for p in (chroot.root / f"srv/{suite}/pool").glob("*.deb"))


def deb_of(chroot: Chroot, suite: str, name: str) -> str:
    """Chroot path of ``name``'s .deb in one local suite."""
    found = [p for p in pool_files(chroot, suite) if p.rsplit("/", 1)[1].startswith(f"{name}_")]
    assert len(found) == 1, (suite, name, found)
    return found[0]
