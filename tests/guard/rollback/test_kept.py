"""Bounded disk for the kept package files: one file per name, version and arch, the set before the last change
kept beside the recorded one, everything else removed, and a size cap that says what it dropped."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Dict

from agent import log
from agent.guard.rollback.backend import InstalledPackage
from agent.guard.rollback.kept import KeptFile, Manifest, keep_set
from agent.host import Host
from tests.fakes.runner import FakeRunner

DIRECTORY = "/var/lib/gpuguard/debs"


class SizedCache:
    """A kept-files directory whose ensure writes a file of the size given per package name (rebuilt)."""

    def __init__(self, host: Host, sizes: Dict[str, int]) -> None:
        self.host, self.directory, self.sizes = host, DIRECTORY, sizes
        self.ensured = 0

    def path(self, name: str, version: str, arch: str) -> str:
        return f"{DIRECTORY}/{name}_{version}_{arch}.deb"

    def find(self, name: str, version: str, arch: str, manifest: Manifest) -> KeptFile:
        target = self.path(name, version, arch)
        if not self.host.path(target).is_file():
            self.ensured += 1
            self.host.path(DIRECTORY).mkdir(parents=True, exist_ok=True)
            self.host.path(target).write_bytes(b"x" * self.sizes[name])
        kept = KeptFile(target, "rebuilt")
        manifest.remember(kept)
        return kept


def _set(**versions: str) -> Dict[str, InstalledPackage]:
    return {name.replace("_", "-"): InstalledPackage(v, "amd64") for name, v in versions.items()}


def _names(root: Path) -> list:
    return sorted(p.name for p in (root / DIRECTORY.lstrip("/")).glob("*.deb"))


def test_the_set_before_the_change_keeps_its_files_and_the_rest_go(tmp_path: Path) -> None:
    """A compliant change of one package: the new set's file is added, the old set's kept (the health-gated
    rollback restores it), an unchanged package's one file serves both, and a set no one references any more
    loses its files at the next change, as do what a killed rebuild left."""
    host = Host(root=tmp_path, runner=FakeRunner())
    cache = SizedCache(host, {"libnvidia-compute-580": 10, "cuda-cudart-13-0": 10})
    first = _set(libnvidia_compute_580="580.95.05-1", cuda_cudart_13_0="13.0.96-1")
    keep_set(host, cache, ".deb", first, {}, 0)
    second = _set(libnvidia_compute_580="580.105.08-1", cuda_cudart_13_0="13.0.96-1")
    files = keep_set(host, cache, ".deb", second, first, 0)
    assert all(k.restorable for k in files.values()) and cache.ensured == 3
    assert _names(tmp_path) == ["cuda-cudart-13-0_13.0.96-1_amd64.deb", "libnvidia-compute-580_580.105.08-1_amd64.deb",
                                "libnvidia-compute-580_580.95.05-1_amd64.deb"]
    (tmp_path / DIRECTORY.lstrip("/") / "cuda-cudart-13-0_13.0.97-1_amd64.deb.partial").write_bytes(b"killed")
    (tmp_path / DIRECTORY.lstrip("/") / ".rebuild-x.rpm/stage").mkdir(parents=True)
    third = _set(libnvidia_compute_580="580.105.08-1", cuda_cudart_13_0="13.0.97-1")
    keep_set(host, cache, ".deb", third, second, 0)
    assert _names(tmp_path) == ["cuda-cudart-13-0_13.0.96-1_amd64.deb", "cuda-cudart-13-0_13.0.97-1_amd64.deb",
                                "libnvidia-compute-580_580.105.08-1_amd64.deb"]
    left = sorted(p.name for p in (tmp_path / DIRECTORY.lstrip("/")).iterdir())
    assert left == sorted([*_names(tmp_path), "kept.json"])
    manifest = json.loads((tmp_path / DIRECTORY.lstrip("/") / "kept.json").read_text())
    assert sorted(manifest["files"]) == _names(tmp_path)


def test_over_the_cap_the_older_set_goes_first_then_the_largest_with_a_report(tmp_path: Path) -> None:
    """kept_packages_max_bytes reached: the set before the change loses its files first, then the recorded set's
    largest file, which is then not restorable with the reason; one warning names what was dropped."""
    host = Host(root=tmp_path, runner=FakeRunner())
    cache = SizedCache(host, {"libcublas-13-0": 600, "cuda-cudart-13-0": 100, "libnvidia-compute-580": 200})
    before = _set(libnvidia_compute_580="580.95.05-1")
    keep_set(host, cache, ".deb", before, {}, 0)
    now = _set(libnvidia_compute_580="580.105.08-1", libcublas_13_0="13.0.2-1", cuda_cudart_13_0="13.0.96-1")
    stream = io.StringIO()
    log.configure("info", json_output=True, stream=stream)
    try:
        files = keep_set(host, cache, ".deb", now, before, 500)
    finally:
        log.configure("info")
    assert files["libcublas-13-0"].path is None and "kept_packages_max_bytes (500 bytes)" in \
        files["libcublas-13-0"].reason
    assert files["libnvidia-compute-580"].restorable and files["cuda-cudart-13-0"].restorable
    assert _names(tmp_path) == ["cuda-cudart-13-0_13.0.96-1_amd64.deb", "libnvidia-compute-580_580.105.08-1_amd64.deb"]
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["event"], e["dropped"], e["kept_bytes"]) for e in events] == [
        ("kept_packages_cap_reached", ["libnvidia-compute-580_580.95.05-1_amd64.deb",
                                       "libcublas-13-0_13.0.2-1_amd64.deb"], 300)]
