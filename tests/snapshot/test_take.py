"""Taking a snapshot: isolation of failing collectors, hash stability, findings."""

from __future__ import annotations

from agent.collectors import default_collectors
from agent.errors import CollectorUnavailable, HostReadError
from agent.frozen import replace
from agent.snapshot.model import compute_content_hash
from agent.snapshot.take import take_snapshot
from tests.conftest import make_fixture_host


class _Crashing:
    name = "containers"

    def collect(self, host):
        raise ZeroDivisionError("boom")


class _Broken:
    name = "dkms"

    def collect(self, host):
        raise HostReadError("/var/lib/dkms", "Permission denied")


def _replace(collectors, *replacements):
    by_name = {c.name: c for c in replacements}
    return tuple(by_name.get(c.name, c) for c in collectors)


def test_one_broken_collector_never_aborts_the_snapshot() -> None:
    """A crashing and a failing collector are recorded as errors; the other sections are still collected."""
    host = make_fixture_host("gpuless-debian12")
    snap = take_snapshot(host, _replace(default_collectors(), _Crashing(), _Broken()))
    assert snap.containers.status.value == "error" and "ZeroDivisionError" in snap.containers.reason
    assert snap.dkms.status.value == "error" and "Permission denied" in snap.dkms.reason
    assert snap.os.status.value == "ok" and snap.dpkg.status.value == "ok"


def test_content_hash_is_stable_and_ignores_time() -> None:
    """Two snapshots of an unchanged host hash the same, whatever the clock says."""
    host = make_fixture_host("gpuless-debian12")
    first = take_snapshot(host)
    second = take_snapshot(make_fixture_host("gpuless-debian12"))
    later = replace(second, taken_at=second.taken_at.replace(year=2030))
    assert first.content_hash == second.content_hash == compute_content_hash(later)
    assert first.content_hash.startswith("sha256:")


def test_content_hash_changes_with_content() -> None:
    """A changed package version changes the hash."""
    snap = take_snapshot(make_fixture_host("gpuless-debian12"))
    packages = dict(snap.dpkg.data.packages)
    packages["runc"] = replace(packages["runc"], version="1.1.12-1")
    changed = replace(snap, dpkg=replace(snap.dpkg, data=replace(snap.dpkg.data, packages=packages)))
    assert compute_content_hash(changed) != snap.content_hash


def test_absent_sections_carry_their_reason() -> None:
    """A GPU-less host records the GPU sections as absent with a reason, not as errors."""
    snap = take_snapshot(make_fixture_host("gpuless-debian12"))
    for name in ("amdgpu", "nvidia", "rocm", "cuda", "rpm", "dkms"):
        section = getattr(snap, name)
        assert section.status.value == "absent", name
        assert section.reason
    assert isinstance(CollectorUnavailable("x"), Exception)
