"""Every judgement of one host sees the same facts: the apt hook, ``policy explain``, the daemon's compliance check,
the rollback check and the facts ``policy freeze`` reads give the same rule ids for one policy and one host.

The host (built under tmp_path): Debian 12 with an MI355X (gfx950) in the KFD topology, amdgpu-dkms and ROCm 6.2
in dpkg's status, the DKMS amdgpu module and an NVIDIA module loaded that no package carries. The policy requires
AMD's compatibility matrix (ROCm 6.2 lists neither Debian 12 nor gfx950), pins ROCm 6.3 and the r570 NVIDIA
driver. Before the host context had one builder, ``policy explain`` had no GPU targets (no ``matrix.gpu``) and the
rollback check neither OS nor GPU targets.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Dict, List, Set

import pytest

from agent.cli import main
from agent.commands.policy import read_freeze_facts
from agent.config import Settings
from agent.host import Host
from agent.policy.compiled import read_compiled
from agent.policy.evaluate import HostState, evaluate
from agent.policy.load import load_and_compile, write_compiled
from agent.report.compliance import check_snapshot
from agent.snapshot.take import take_snapshot
from tests.conftest import fake_module_loader, fixed_clock
from tests.fakes.runner import FakeRunner
from tests.guard.apt.test_hook import HEAD, line, run_hook
from tests.guard.wiring import check

POLICY = """
[policy]
name = "equal-judgement"
require_amd_matrix = true
[[amd.pairing]]
name = "rocm-6.3"
amdgpu = "6.3.*"
rocm = "6.3.*"
[[nvidia.pairing]]
name = "r570"
driver = "570.*"
cuda = "any"
"""
EXPECTED = {"amd.pairing", "matrix.os", "matrix.gpu", "nvidia.pairing"}


def _properties(**values: int) -> str:
    return "".join(f"{name} {value}\n" for name, value in values.items())


def _status(packages: Dict[str, str]) -> str:
    return "".join(f"Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\n"
                   f"Description: {name}\n\n" for name, version in packages.items())


HOST_FILES = {
    "etc/os-release": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n'
                      "VERSION_CODENAME=bookworm\n",
    "proc/sys/kernel/osrelease": "6.1.0-26-amd64\n",
    "proc/sys/kernel/hostname": "mi355x-bookworm\n",
    "sys/class/kfd/kfd/topology/nodes/0/properties": _properties(cpu_cores_count=128, simd_count=0,
                                                                 gfx_target_version=0, vendor_id=0, device_id=0),
    "sys/class/kfd/kfd/topology/nodes/1/properties": _properties(cpu_cores_count=0, simd_count=1024,
                                                                 gfx_target_version=90500, vendor_id=4098,
                                                                 device_id=30115, location_id=1280, domain=0),
    "sys/class/drm/card0/dev": "226:0\n",
    "sys/class/drm/card0/device/uevent": "DRIVER=amdgpu\nPCI_CLASS=120000\nPCI_ID=1002:75A3\n"
                                         "PCI_SLOT_NAME=0000:05:00.0\n",
    "sys/class/drm/card0/device/vendor": "0x1002\n",
    "sys/class/drm/card0/device/device": "0x75a3\n",
    "sys/module/amdgpu/initstate": "live\n",
    "sys/module/amdgpu/version": "6.8.5\n",
    "sys/module/nvidia/version": "580.159.04\n",
    "var/lib/dpkg/status": _status({"amdgpu-dkms": "1:6.8.5.60202-2041575.22.04",
                                    "amdgpu-dkms-firmware": "1:6.8.5.60202-2041575.22.04",
                                    "rocm-core": "6.2.2.60202-116~22.04",
                                    "linux-image-6.1.0-26-amd64": "6.1.112-1", "vim": "2:9.0.1378-2"}),
    "etc/gpuguard/policy.d/10-site.toml": POLICY,
}
CONFIG = ["--config", "/nonexistent/agent.toml"]


def _build_root(host_root: Path, files: Dict[str, str]) -> Path:
    """The files under ``host_root``, the policy in policy.d compiled into the state directory."""
    for relative, text in files.items():
        (host_root / relative).parent.mkdir(parents=True, exist_ok=True)
        (host_root / relative).write_text(text)
    _, compiled = load_and_compile(str(host_root / "etc/gpuguard/policy.d"))
    write_compiled(str(host_root / "var/lib/gpuguard/policy.compiled.json"), compiled)
    return host_root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The Debian 12 gfx950 host with the policy in policy.d and compiled in the state directory."""
    return _build_root(tmp_path / "root", HOST_FILES)


def _host(root: Path) -> Host:
    """A Host over the root that runs no command (an unrecorded one fails the test) and has no GPU library."""
    return Host(root=root, runner=FakeRunner([], str(root)), load_module=fake_module_loader({}), clock=fixed_clock)


def _cli(root: Path, *argv: str) -> str:
    out = io.StringIO()
    main(list(argv), make_host=lambda _: _host(root), out=out)
    return out.getvalue()


def hook_rules(root: Path) -> Set[str]:
    """The apt hook (protocol v3) on a transaction that touches none of the stack: every violation is a note."""
    code, out = run_hook(root, HEAD + line("vim", "2:9.0.1378-2", "2:9.0.1378-3"))
    assert code == 0, out
    return set(re.findall(r"note: the host already violates the policy \(([\w.]+)\)", out))


def explain_rules(root: Path) -> Set[str]:
    """``gpuguard policy explain --json`` under the root."""
    data = json.loads(_cli(root, "policy", "explain", "--root", str(root), "--json", *CONFIG))
    return {v["rule"] for v in data["violations"]}


def compliance_rules(root: Path) -> Set[str]:
    """The daemon's compliance check over a snapshot taken from the root."""
    violations = check_snapshot(take_snapshot(_host(root)), Settings().agent.state_dir, root=str(root))
    assert violations is not None
    return {v.rule for v in violations}


def rollback_rules(root: Path) -> Set[str]:
    """The rollback check in dry-run (no known-good set yet: it reports every violation and records nothing)."""
    result = check(_host(root), Settings(), dry_run=True)
    assert result.status == "no_known_good", result.summary()
    return {v.rule for v in result.violations}


def freeze_rules(root: Path) -> Set[str]:
    """The facts ``policy freeze`` reads (packages, running kernel, host context), judged by the policy."""
    facts = read_freeze_facts(_host(root))
    policy = read_compiled(str(root / "var/lib/gpuguard/policy.compiled.json"))
    state = HostState(before=facts.installed, after=facts.installed, manager=facts.manager, context=facts.context)
    return {v.rule for v in evaluate(state, policy)}


PATHS = [hook_rules, explain_rules, compliance_rules, rollback_rules, freeze_rules]


@pytest.mark.parametrize("judge", PATHS, ids=[p.__name__ for p in PATHS])
def test_each_path_finds_every_rule_the_host_breaks(root: Path, judge) -> None:
    """Each path judges the host by the same facts: the matrix's OS and GPU rules, the pairings, the loaded module."""
    assert judge(root) == EXPECTED


def test_every_path_gives_the_same_rule_ids(root: Path) -> None:
    """The hook, explain, compliance, the rollback check and freeze's facts agree, rule id for rule id."""
    found: List[Set[str]] = [judge(root) for judge in PATHS]
    assert all(rules == found[0] for rules in found), dict(zip([p.__name__ for p in PATHS], found))


PIN_POLICY = """
[policy]
name = "pins-by-context"
require_amd_matrix = true
[[amd.pairing]]
name = "driver-6.4"
amdgpu = "6.4.*"
rocm = "any"
"""


def test_pin_records_forbid_what_the_hook_refuses_for_this_hosts_gpu(root: Path, tmp_path: Path) -> None:
    """``pin apply``'s records judge a build with the host's context as the hook does: on the gfx950 host ROCm 6.4
    (not in the matrix for gfx950) beside driver 6.4 is pinned away for ``matrix.gpu``; without the context it was
    let through, so the pins and the hook disagreed."""
    from agent.guard.pin_records import pin_records
    from agent.hostfacts.context import read_host_context
    from agent.policy.evaluate import facts_used

    policy_file = tmp_path / "pins.toml"
    policy_file.write_text(PIN_POLICY)
    _, policy = load_and_compile(str(policy_file))
    installed = {"amdgpu-dkms": "1:6.12.12.60400-2147987.22.04", "rocm-core": "7.0.0.70000-38~22.04"}
    available = {"rocm-core": ["6.4.0.60400-47~22.04", "7.0.0.70000-38~22.04"]}
    context = read_host_context(str(root), facts_used(policy))
    _, forbidden = pin_records(policy, installed, available, context=context)
    assert [(p.package, p.version) for p in forbidden] == [("rocm-core", "6.4.0.60400-47~22.04")]
    assert "matrix.gpu" in forbidden[0].why
    _, blind = pin_records(policy, installed, available, context=None)
    assert "matrix.gpu" not in " ".join(p.why for p in blind)


@pytest.fixture
def companion_root(tmp_path: Path) -> Path:
    """The same host with [companions] in its policy, fabric manager 580.105.08 beside the loaded module 580.159.04
    (no driver package), and PyPI's amdsmi 7.0.2 pip installed beside ROCm 6.4's amd-smi-lib."""
    files = dict(HOST_FILES)
    files["etc/gpuguard/policy.d/10-site.toml"] = POLICY + "[companions]\n"
    files["var/lib/dpkg/status"] += _status({"nvidia-fabricmanager-580": "580.105.08-1",
                                             "amd-smi-lib": "25.5.1.60401-83~22.04"})
    files["usr/local/lib/python3.11/dist-packages/amdsmi-7.0.2.dist-info/METADATA"] = "Name: amdsmi\nVersion: 7.0.2\n"
    return _build_root(tmp_path / "root", files)


@pytest.mark.parametrize("judge", PATHS, ids=[p.__name__ for p in PATHS])
def test_each_path_sees_the_companions_host_facts(companion_root: Path, judge) -> None:
    """Fabric manager judged against the loaded module and the pip amdsmi binding against the library: every path
    reads both facts through the one host-context builder and finds both companion rules."""
    assert judge(companion_root) == EXPECTED | {"companion.fabricmanager", "companion.amdsmi"}


def test_the_snapshot_reports_the_pip_binding_as_explain_does(companion_root: Path) -> None:
    """The snapshot's finding for the pip amdsmi binding (no ROCm tree on the host) is the sentence ``policy
    explain`` and the hook give for companion.amdsmi (before, the snapshot judged packaged bindings only)."""
    snap = take_snapshot(_host(companion_root))
    found = {f.details["rule"]: f.message for f in snap.findings if f.kind == "companion_mismatch"}
    data = json.loads(_cli(companion_root, "policy", "explain", "--root", str(companion_root), "--json", *CONFIG))
    explained = {v["rule"]: v["message"] for v in data["violations"]}
    assert "the pip amdsmi binding 7.0.2" in found["companion.amdsmi"]
    assert found["companion.amdsmi"] == explained["companion.amdsmi"]
