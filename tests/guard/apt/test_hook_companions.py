"""The apt hook and the dnf checker refuse transactions that break a companion pairing: fabric manager left behind
by a driver upgrade, DCGM's packages split across releases, dcgm-exporter beside a DCGM of another series, the amdsmi
binding left at another ROCm release than its library. Fake roots, the hook's and checker's own entry points."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path
from typing import Dict, Tuple

import pytest

from agent.guard.dnf import check as dnf_check
from agent.guard.dnf.request import request_document
from agent.guard.hotpath import decision as exits
from agent.policy.load import load_and_compile, write_compiled
from tests.guard.apt.test_hook import HEAD, line, run_hook

NOW = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.timezone.utc)
POLICY = """
[policy]
name = "companions"
[companions]
"""
NV, NV_NEW = "580.95.05-0ubuntu0.24.04.2", "580.105.08-0ubuntu0.24.04.1"
HOST = {"nvidia-driver-580-open": NV, "libnvidia-compute-580": NV, "nvidia-utils-580": NV,
        "nvidia-fabricmanager-580": "580.95.05-1", "libnvidia-nscq-580": "580.95.05-1",
        "datacenter-gpu-manager-4-core": "1:4.6.1-1", "datacenter-gpu-manager-4-cuda13": "1:4.6.1-1",
        "dcgm-exporter": "4.8.4-1", "amd-smi": "6.1.2-1", "libamd-smi0": "6.1.2-1", "vim": "2:9.0.1378-2"}


def _status(packages: Dict[str, str]) -> str:
    return "".join(f"Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\n"
                   f"Description: x\n\n" for name, version in packages.items())


def _root(tmp_path: Path, packages: Dict[str, str], policy: str = POLICY) -> Path:
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(_status(packages))
    (tmp_path / "policy.toml").write_text(policy)
    _, compiled = load_and_compile(str(tmp_path / "policy.toml"))
    write_compiled(str(tmp_path / "var/lib/gpuguard/policy.compiled.json"), compiled)
    return tmp_path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return _root(tmp_path, HOST)


def _refusals(out: str) -> list:
    return [ln for ln in out.splitlines() if "REFUSED (" in ln]


def test_driver_upgrade_without_fabric_manager_is_refused_naming_both_builds(root: Path) -> None:
    """apt upgrading the driver's packages to 580.105.08 while fabric manager stays at 580.95.05: exit 10, one
    REFUSED line per companion naming both builds, the event recorded, nothing else said."""
    text = HEAD + "".join(line(n, NV, NV_NEW) for n in ("nvidia-driver-580-open", "libnvidia-compute-580",
                                                         "nvidia-utils-580"))
    code, out = run_hook(root, text, now=NOW)
    assert code == exits.EXIT_REFUSED
    refused = _refusals(out)
    assert len(refused) == 2 and all("REFUSED (companion.fabricmanager)" in r for r in refused)
    assert any("nvidia-fabricmanager-580 580.95.05 needs driver 580.95.05; the transaction leaves driver 580.105.08 "
               "(libnvidia-compute-580, nvidia-driver-580-open, nvidia-utils-580)" in r for r in refused)
    events = [json.loads(e) for e in (root / "var/lib/gpuguard/guard-events.jsonl").read_text().splitlines()]
    assert {e["rule"] for e in events if e["kind"] == "transaction_blocked"} == {"companion.fabricmanager"}


def test_driver_and_fabric_manager_moving_together_pass(root: Path) -> None:
    """The same upgrade with fabric manager and NSCQ at the new build passes silently."""
    text = HEAD + "".join(line(n, NV, NV_NEW) for n in ("nvidia-driver-580-open", "libnvidia-compute-580",
                                                         "nvidia-utils-580"))
    text += "".join(line(n, "580.95.05-1", "580.105.08-1") for n in ("nvidia-fabricmanager-580",
                                                                       "libnvidia-nscq-580"))
    assert run_hook(root, text, now=NOW) == (exits.EXIT_ALLOW, "")


def test_fabric_manager_against_the_loaded_module_when_no_package_carries_the_driver(tmp_path: Path) -> None:
    """A .run driver (no package, module 580.95.05 loaded): installing fabric manager 580.105.08 is refused, its
    own build passes; the hook read the module through the host context."""
    root = _root(tmp_path, {"vim": "2:9.0.1378-2"})
    (root / "sys/module/nvidia").mkdir(parents=True)
    (root / "sys/module/nvidia/version").write_text("580.95.05\n")
    code, out = run_hook(root, HEAD + line("nvidia-fabricmanager-580", "-", "580.105.08-1"), now=NOW)
    assert code == exits.EXIT_REFUSED
    assert "the transaction leaves driver 580.95.05 (the loaded nvidia module; no driver package)" in out
    assert run_hook(root, HEAD + line("nvidia-fabricmanager-580", "-", "580.95.05-1"), now=NOW)[0] == exits.EXIT_ALLOW


def test_half_a_dcgm_upgrade_is_refused(root: Path) -> None:
    """Upgrading datacenter-gpu-manager-4-core to 4.7.1 without -cuda13 splits DCGM across releases: refused;
    the exporter built with 4.6 is refused beside 4.7 too."""
    code, out = run_hook(root, HEAD + line("datacenter-gpu-manager-4-core", "1:4.6.1-1", "1:4.7.1-1"), now=NOW)
    assert code == exits.EXIT_REFUSED
    assert {r.split(")")[0] for r in _refusals(out)} == {"gpuguard: REFUSED (companion.dcgm",
                                                          "gpuguard: REFUSED (companion.dcgm_exporter"}
    assert "DCGM's packages are not one release: 4.6.1 (datacenter-gpu-manager-4-cuda13), 4.7.1 " \
           "(datacenter-gpu-manager-4-core)" in out
    assert "dcgm-exporter 4.8.4 (built with DCGM 4.6.1) needs DCGM 4.6.x; the host has DCGM 4.6.1 " \
           "(datacenter-gpu-manager-4-cuda13), 4.7.1 (datacenter-gpu-manager-4-core)" in out


def test_dcgm_and_exporter_moving_to_a_tested_pairing_pass(root: Path) -> None:
    """DCGM 4.7.0 (both packages) with dcgm-exporter 4.9.0, which NVIDIA tested with DCGM 4.7, passes."""
    text = HEAD + line("datacenter-gpu-manager-4-core", "1:4.6.1-1", "1:4.7.0-1")
    text += line("datacenter-gpu-manager-4-cuda13", "1:4.6.1-1", "1:4.7.0-1") + line("dcgm-exporter", "4.8.4-1",
                                                                                   "4.9.0-1")
    assert run_hook(root, text, now=NOW) == (exits.EXIT_ALLOW, "")


def test_exporter_upgrade_beyond_the_host_dcgm_is_refused(root: Path) -> None:
    """dcgm-exporter 4.9.0 (built with DCGM 4.7) on the host's DCGM 4.6.1 is refused; an exporter release the table
    does not know is refused saying so."""
    code, out = run_hook(root, HEAD + line("dcgm-exporter", "4.8.4-1", "4.9.0-1"), now=NOW)
    assert code == exits.EXIT_REFUSED
    assert "dcgm-exporter 4.9.0 (built with DCGM 4.7.0) needs DCGM 4.7.x; the host has DCGM 4.6.1 " \
           "(datacenter-gpu-manager-4-core, datacenter-gpu-manager-4-cuda13)" in out
    code, out = run_hook(root, HEAD + line("dcgm-exporter", "4.8.4-1", "4.8.9-1"), now=NOW)
    assert code == exits.EXIT_REFUSED
    assert "dcgm-exporter 4.8.9-1 is not in gpuguard's dcgm-exporter table" in out


def test_dcgm_and_exporter_moving_past_the_table_are_not_refused_for_being_new(root: Path) -> None:
    """The apt hook lets DCGM 4.9.0 with dcgm-exporter 4.11.0 (both newer than the table's newest row) through: a
    version newer than gpuguard's table is reported by the snapshot, status and explain, never refused for it."""
    text = HEAD + line("datacenter-gpu-manager-4-core", "1:4.6.1-1", "1:4.9.0-1")
    text += line("datacenter-gpu-manager-4-cuda13", "1:4.6.1-1", "1:4.9.0-1") + line("dcgm-exporter", "4.8.4-1",
                                                                                   "4.11.0-1")
    assert run_hook(root, text, now=NOW) == (exits.EXIT_ALLOW, "")


def test_amdsmi_binding_left_behind_its_library_is_refused(root: Path) -> None:
    """Debian's libamd-smi upgraded to another ROCm release while the amd-smi binding package stays: refused."""
    code, out = run_hook(root, HEAD + line("libamd-smi0", "6.1.2-1", "6.4.1-1"), now=NOW)
    assert code == exits.EXIT_REFUSED
    assert "REFUSED (companion.amdsmi)" in out
    assert "amd-smi 6.1.2-1 needs libamd_smi of ROCm 6.1; the transaction leaves libamd_smi of ROCm 6.4.1 " \
           "(libamd-smi0)" in out


def test_pip_binding_judged_at_transaction_time(tmp_path: Path) -> None:
    """A pip amdsmi 7.0.2 binding in /usr/local's dist-packages with ROCm 7.0.2's amd-smi-lib: upgrading the
    library to ROCm 7.1 is refused naming the binding's place; moving to 7.0.3 passes."""
    root = _root(tmp_path, {"amd-smi-lib": "26.0.2.70002-56~24.04"})
    (root / "usr/local/lib/python3.12/dist-packages/amdsmi-7.0.2.dist-info").mkdir(parents=True)
    code, out = run_hook(root, HEAD + line("amd-smi-lib", "26.0.2.70002-56~24.04", "26.1.0.70100-20~24.04"), now=NOW)
    assert code == exits.EXIT_REFUSED
    assert "the pip amdsmi binding 7.0.2 (/usr/local/lib/python3.12/dist-packages) needs libamd_smi of ROCm 7.0; " \
           "the transaction leaves libamd_smi of ROCm 7.1.0 (amd-smi-lib)" in out
    ok = run_hook(root, HEAD + line("amd-smi-lib", "26.0.2.70002-56~24.04", "26.0.3.70003-1~24.04"), now=NOW)
    assert ok == (exits.EXIT_ALLOW, "")


def _check(root: Path, installed, items) -> Tuple[int, str]:
    err = io.StringIO()
    text = json.dumps(request_document(installed, items, command_line="dnf upgrade"))
    code = dnf_check.main(["--root", str(root)], stdin=io.BytesIO(text.encode()), err=err, now=lambda: NOW)
    return code, err.getvalue()


def test_dnf_checker_refuses_the_driver_leaving_rpm_fabric_manager_behind(tmp_path: Path) -> None:
    """On rpm: nvidia-driver 580.105.08 with nvidia-fabric-manager 580.95.05 is refused by the dnf checker with the
    same message shape as apt's."""
    root = _root(tmp_path, {})
    driver_old = ("nvidia-driver", 3, "580.95.05", "1.el9", "x86_64")
    driver_new = ("nvidia-driver", 3, "580.105.08", "1.el9", "x86_64")
    fm = ("nvidia-fabric-manager", 0, "580.95.05", "1", "x86_64")
    code, out = _check(root, [driver_old, fm], [driver_new + ("in", "Upgrade"), driver_old + ("out", "Upgraded")])
    assert code == exits.EXIT_REFUSED
    assert "REFUSED (companion.fabricmanager)" in out
    assert "nvidia-fabric-manager 580.95.05 needs driver 580.95.05; the transaction leaves driver 580.105.08 " \
           "(nvidia-driver)" in out
