"""Side-by-side TheRock trees under real apt, dpkg and update-alternatives (issue 40): 7.14 and 10.0 installed
together, ``/opt/rocm/core`` chosen by the alternative ``core`` that each release's ``amdrocm-core<release>``
postinst registers (``update-alternatives --install``). The snapshot and the pairing name the tree it points at and
amdsmi is judged against that tree; a failed post-change check after repointing to 10.0 falls back to 7.14's tree by
repointing (no package change) and passes again; ``[amd] active_tree = "pinned"`` refuses a tree no release package
carries."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from agent.config import Settings
from agent.host import Host
from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import Chroot, FakePackage
from tests.guard.wiring import check, cpu_fallback_payloads, health_job

pytestmark = pytest.mark.timeout(900)

RELEASES = {"7.14": ("7.14.0-1", 714), "10.0": ("10.0.0-4", 1000)}  # release -> (Version, alternative priority)
TREE_714, TREE_100 = "/opt/rocm/core-7.14", "/opt/rocm/core-10.0"
BINDING_714 = "27.0.0.71400-1"  # python3-amdsmi: amdsmi 27.0.0 built for ROCm 7.14.0


def release_debs(release: str) -> List[FakePackage]:
    """One TheRock release as versioned packages at exact = dependencies; ``amdrocm-core<release>`` registers its
    tree as a choice of the alternative ``core`` in its postinst and takes it out in its prerm, as the amdrocm
    metas do."""
    version, priority = RELEASES[release]
    tree = f"/opt/rocm/core-{release}"
    base = f"amdrocm-base{release} (= {version})"
    postinst = (f'if [ "$1" = configure ]; then\n  update-alternatives --install /opt/rocm/core core {tree} '
                f'{priority}\nfi')
    prerm = f'if [ "$1" = remove ] || [ "$1" = deconfigure ]; then\n  update-alternatives --remove core {tree}\nfi'
    return [
        FakePackage(f"amdrocm-base{release}", version,
                    files=((f"{tree}/.info/version", version.split("-")[0] + "\n"),
                           (f"{tree}/bin/rocminfo", "fake rocminfo\n"))),
        FakePackage(f"amdrocm-amdsmi{release}", version, depends=base,
                    files=((f"{tree}/lib/libamd_smi.so.27", "fake libamd_smi, SONAME libamd_smi.so.27\n"),)),
        FakePackage(f"amdrocm-core{release}", version, depends=f"{base}, amdrocm-amdsmi{release} (= {version})",
                    scripts=(("postinst", postinst), ("prerm", prerm))),
    ]


def _debs() -> List[FakePackage]:
    return [*release_debs("7.14"), *release_debs("10.0"), FakePackage("python3-amdsmi", BINDING_714)]


def _amd(chroot: Chroot) -> Dict[str, str]:
    return {n: v for n, v in chroot.present().items() if n.startswith(("amdrocm", "python3-amdsmi"))}


def _set_tree(chroot: Chroot, tree: str) -> None:
    ran = chroot.run("update-alternatives", "--set", "core", tree)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def _active(chroot: Chroot) -> str:
    """Where /opt/rocm/core points, read in the chroot as a program would."""
    return chroot.run("readlink", "-f", "/opt/rocm/core", check=True).stdout.strip()


@pytest.fixture
def both(chroot: Chroot, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chroot]:
    """TheRock 7.14 and 10.0 side by side (classic ROCm removed), the alternative set by hand to 7.14's tree, frozen
    by ``policy freeze`` and recorded as known-good; packages, alternative, policy and extra trees gone after."""
    policy_dir = chroot.root / "etc/gpuguard/policy.d"
    with chroot.packages_in_repo(_debs(), tmp_path_factory.mktemp("therock-trees-debs")):
        try:
            gone = chroot.apt("remove", "rocm-hip-runtime", "rocm-core", hook=False)
            assert gone.returncode == 0, gone.stdout + gone.stderr
            got = chroot.apt("install", f"amdrocm-core7.14={RELEASES['7.14'][0]}",
                             f"amdrocm-core10.0={RELEASES['10.0'][0]}", hook=False)
            assert got.returncode == 0, got.stdout + got.stderr
            assert _active(chroot) == TREE_100  # auto: the highest priority
            _set_tree(chroot, TREE_714)
            for old in policy_dir.glob("*.toml"):
                old.unlink()
            code, out = gpuguard(chroot, "policy", "freeze", "--output", str(policy_dir / "50-freeze.toml"))
            assert code == 0, out
            code, out = gpuguard(chroot, "policy", "compile")
            assert code == 0, out
            (chroot.state_dir / "known-good.json").unlink(missing_ok=True)
            assert check(Host.for_root(str(chroot.root)), Settings(), snapshot=lambda h: None).status == "recorded"
            yield chroot
        finally:
            names = list(_amd(chroot))
            if names:
                chroot.run("dpkg", "--purge", "--force-depends", *names, check=True)
            chroot.run("update-alternatives", "--remove-all", "core")
            for extra in policy_dir.glob("*.toml"):
                extra.unlink()
            for leftover in ("opt/rocm/core-10.1",):
                target = chroot.root / leftover
                if target.exists():
                    for path in sorted(target.rglob("*"), reverse=True):
                        path.unlink() if not path.is_dir() else path.rmdir()
                    target.rmdir()
            for name in ("health-gate.json", "health-rollback.json"):
                (chroot.state_dir / name).unlink(missing_ok=True)


def _snapshot(chroot: Chroot) -> dict:
    code, out = gpuguard(chroot, "snapshot", "--json")
    assert code == 0, out
    return json.loads(out)


def test_the_snapshot_and_pairing_name_the_active_tree_and_judge_amdsmi_against_it(both: Chroot) -> None:
    """The snapshot names the tree the alternative core points at (mode, choices) and the pairing carries it, a
    repoint is a stack change for the daemon, and the 7.14 amdsmi binding is fine while core points at 7.14 and a
    finding once it points at 10.0 (today: the tree is not read and both libraries count, so no finding)."""
    from agent.daemon_jobs.snapshot import stack_changed
    from agent.snapshot.diff import diff_snapshots
    from agent.snapshot.io import validate_snapshot
    from agent.snapshot.pairing import pairing_of

    got = both.apt("install", f"python3-amdsmi={BINDING_714}", hook=False)
    assert got.returncode == 0, got.stdout + got.stderr
    snap = _snapshot(both)
    rocm = snap["rocm"]["data"]
    assert rocm["alternative"] == {"name": "core", "link": "/opt/rocm/core", "target": TREE_714, "mode": "manual",
                                   "choices": [TREE_100, TREE_714]}
    assert (rocm["active_path"], rocm["version"]) == (TREE_714, "7.14.0")
    assert pairing_of(validate_snapshot(snap)).rocm_active_tree == TREE_714
    assert not [f for f in snap["findings"] if f["kind"] == "companion_mismatch"]

    _set_tree(both, TREE_100)
    before, snap = snap, _snapshot(both)
    # the daemon's snapshot job sees the repoint as a move of the stack: the health check after a change runs
    assert stack_changed(diff_snapshots(validate_snapshot(before), validate_snapshot(snap)))
    rocm = snap["rocm"]["data"]
    assert (rocm["alternative"]["target"], rocm["active_path"], rocm["version"]) == (TREE_100, TREE_100, "10.0.0")
    assert pairing_of(validate_snapshot(snap)).rocm_active_tree == TREE_100
    found = [f["message"] for f in snap["findings"] if f["kind"] == "companion_mismatch"]
    assert found == [f"python3-amdsmi {BINDING_714} (amdsmi 27.0.0 for ROCm 7.14.0) needs libamd_smi of ROCm 7.14; "
                     f"the host has libamd_smi of ROCm 10.0.0 (amdrocm-amdsmi10.0)"], found


class ProbeOfTheActiveTree:
    """Stands in for run_health_check: with /opt/rocm/core on 10.0's tree the chroot "falls back to the CPU"."""

    def __init__(self, chroot: Chroot) -> None:
        self.chroot = chroot
        self.seen: List[tuple] = []

    def __call__(self, host: Host, settings: Any, state_dir: str, snapshot: Any = None,
                 mode: Optional[str] = None) -> Any:
        tree = _active(self.chroot)
        status = "cpu_fallback" if tree == TREE_100 else "pass"
        self.seen.append((tree, status))
        return types.SimpleNamespace(status=status, occupancy=None)


def test_a_failed_check_after_repointing_to_10_0_falls_back_to_7_14_by_repointing(both: Chroot,
                                                                                   tmp_path: Path) -> None:
    """With after_change = "rollback": a pass on 7.14's tree, then update-alternatives --set core to 10.0's tree
    (no package change) and a post-change check that falls back to the CPU: gpuguard repoints the alternative to
    7.14's tree (dpkg's status unchanged, no download), the Rollback event says repoint, and the recheck passes."""
    (both.root / "etc/gpuguard/policy.d/20-health.toml").write_text('[health]\nafter_change = "rollback"\n')
    code, out = gpuguard(both, "policy", "compile")
    assert code == 0, out
    host, settings = Host.for_root(str(both.root)), Settings()
    probe = ProbeOfTheActiveTree(both)
    job = health_job(host, settings, tmp_path, probe, cpu_fallback_payloads)
    assert job.check("interval", None).status == "pass"  # the last set that passed: 7.14's tree
    status, packages = both.status_bytes(), _amd(both)
    _set_tree(both, TREE_100)
    summary = job.check("stack_changed:rocm", "functional", after_change=True)
    assert (summary.rollback, summary.recheck_status, summary.status) == ("rolled_back", "pass", "pass")
    assert _active(both) == TREE_714
    assert both.status_bytes() == status and _amd(both) == packages  # no package moved
    assert probe.seen == [(TREE_714, "pass"), (TREE_100, "cpu_fallback"), (TREE_714, "pass")]
    events = job.runtime.outbox.pending(10)
    assert [(e.kind, e.severity) for e in events] == [("cpu_fallback", "critical"), ("rollback", "warning")]
    rolled = events[1].payload
    assert (rolled.method, rolled.reason, rolled.health_status, rolled.succeeded) == (
        "repoint", "health", "cpu_fallback", True)
    assert (rolled.from_versions, rolled.to_versions) == ({"alternatives:core": TREE_100},
                                                          {"alternatives:core": TREE_714})
    state = json.loads(host.path(job.runtime.paths.health_gate).read_text())
    assert state["passed"]["alternatives:core"] == {"arch": "tree", "version": TREE_714}
    job.runtime.outbox.close()


def test_active_tree_pinned_refuses_a_tree_no_release_package_carries(both: Chroot) -> None:
    """[amd] active_tree = "pinned", which policy freeze writes: a 10.1 nightly tree unpacked by hand and chosen
    by the alternative is a violation in policy explain naming the tree (a transaction that leaves it so goes
    through with the violation noted), removing the release whose tree is active is refused, and core back at 7.14
    is compliant."""
    freeze = (both.root / "etc/gpuguard/policy.d/50-freeze.toml").read_text()
    assert ('active_tree = "pinned"  # update-alternatives points at /opt/rocm/core-7.14 (alternative core, manual): '
            'a tree no installed release package carries is refused') in freeze, freeze
    code, out = gpuguard(both, "policy", "explain")
    assert code == 0 and out.splitlines()[-1] == "current state: compliant", out
    assert (f"active tree: {TREE_714} (alternative core, manual): ROCm 7.14.0 (amdrocm-base7.14); must be a pinned "
            f"release") in out, out

    nightly = both.root / "opt/rocm/core-10.1"
    (nightly / ".info").mkdir(parents=True)
    (nightly / ".info/version").write_text("10.1.0~20261201\n")
    ran = both.run("update-alternatives", "--install", "/opt/rocm/core", "core", "/opt/rocm/core-10.1", "10")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    _set_tree(both, "/opt/rocm/core-10.1")
    code, out = gpuguard(both, "policy", "explain", "--json")
    violations = {v["rule"]: v["message"] for v in json.loads(out)["violations"]}
    assert violations.get("amd.active_tree", "").startswith(
        "the active ROCm tree /opt/rocm/core-10.1 (alternative core, manual) is not a pinned release: no installed "
        "release package carries ROCm 10.1"), out
    # A transaction that leaves it as it is goes through with the host's violation noted, as any standing one.
    noted = both.apt("install", f"python3-amdsmi={BINDING_714}")
    assert noted.returncode == 0, noted.stdout + noted.stderr
    assert "gpuguard: note: the host already violates the policy (amd.active_tree)" in noted.stderr, noted.stderr

    _set_tree(both, TREE_100)
    before = both.status_bytes()
    refused = both.apt("remove", "amdrocm-core10.0", "amdrocm-amdsmi10.0", "amdrocm-base10.0")
    assert refused.returncode == 100, refused.stdout + refused.stderr
    assert "gpuguard: REFUSED (amd.active_tree)" in refused.stderr, refused.stderr
    assert "no installed release package carries ROCm 10.0 after the change" in refused.stderr, refused.stderr
    assert both.status_bytes() == before

    _set_tree(both, TREE_714)
    code, out = gpuguard(both, "policy", "explain")
    assert code == 0 and out.splitlines()[-1] == "current state: compliant", out
