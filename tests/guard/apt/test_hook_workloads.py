"""The apt hook refuses a driver/ROCm/CUDA change to a stack on which a named workload never passed anywhere in the
fleet ([workloads], issue 44), reading the hub's verified list cached in the state directory; no list, or a
damaged one, refuses such changes (fail closed) and nothing else. Fake roots, the hook's own entry point."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from agent.guard.hotpath import decision as exits
from agent.policy.load import load_and_compile, write_compiled
from tests.guard.apt.test_hook import HEAD, line, run_hook

POLICY = """
[policy]
name = "verified"
[workloads]
verified = ["resnet-train", "llm-decode"]
"""
NV_OLD, NV_NEW, NV_OTHER = "570.195.03-0ubuntu1", "580.159.04-0ubuntu1", "580.105.08-0ubuntu1"
AMD_OLD, AMD_NEW = "1:6.8.5.60202-2041575.24.04", "1:6.10.5.60301-2118443.24.04"
ROCM_OLD, ROCM_NEW = "6.2.2.60202-116~24.04", "6.3.1.60301-48~24.04"
NVIDIA_HOST = {"nvidia-driver-570": NV_OLD, "vim": "2:9.0.1378-2"}
AMD_HOST = {"amdgpu-dkms": AMD_OLD, "rocm-core": ROCM_OLD, "vim": "2:9.0.1378-2"}
NVIDIA_580 = {"driver": "nvidia 580.159.04", "gpu_stack": "CUDA 13.0"}
AMD_6_10 = {"driver": "amdgpu 6.10.5", "gpu_stack": "ROCm 6.3.1"}


def _root(tmp_path: Path, verified: Any = None, host: Dict[str, str] = NVIDIA_HOST) -> Path:
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text("".join(
        f"Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\n"
        f"Description: x\n\n" for name, version in host.items()))
    (tmp_path / "policy.toml").write_text(POLICY)
    _, compiled = load_and_compile(str(tmp_path / "policy.toml"))
    write_compiled(str(tmp_path / "var/lib/gpuguard/policy.compiled.json"), compiled)
    if verified is not None:
        cache = tmp_path / "var/lib/gpuguard/workloads-verified.json"
        cache.write_text(verified if isinstance(verified, str) else json.dumps(verified))
    return tmp_path


def _listing(**workloads: List[Dict[str, str]]) -> Dict[str, Any]:
    return {"format": 1, "fetched_at": "2026-12-06T19:00:00.000000Z",
            "workloads": {name.replace("_", "-"): stacks for name, stacks in workloads.items()}}


def _refusals(out: str) -> List[str]:
    return [ln for ln in out.splitlines() if "REFUSED (" in ln]


NVIDIA_UP = line("nvidia-driver-570", NV_OLD, "-") + line("nvidia-driver-580", "-", NV_NEW)
NVIDIA_OTHER = line("nvidia-driver-570", NV_OLD, "-") + line("nvidia-driver-580", "-", NV_OTHER)
AMD_UP = line("amdgpu-dkms", AMD_OLD, AMD_NEW) + line("rocm-core", ROCM_OLD, ROCM_NEW)


def test_a_driver_every_named_workload_passed_on_is_allowed(tmp_path: Path) -> None:
    """Both workloads passed on nvidia 580.159.04 somewhere: the upgrade to it goes through (exit 0)."""
    root = _root(tmp_path, _listing(resnet_train=[NVIDIA_580], llm_decode=[AMD_6_10, NVIDIA_580]))
    code, out = run_hook(root, HEAD + NVIDIA_UP)
    assert code == exits.EXIT_ALLOW and not _refusals(out), out


def test_a_driver_no_host_verified_a_workload_on_is_refused_naming_it_and_the_stack(tmp_path: Path) -> None:
    """llm-decode passed on 580.159.04 only: the move to 580.105.08 is refused naming resnet-train and llm-decode
    (neither passed there) and the stack; to 580.159.04 it is refused naming resnet-train alone."""
    root = _root(tmp_path, _listing(resnet_train=[AMD_6_10], llm_decode=[NVIDIA_580]))
    code, out = run_hook(root, HEAD + NVIDIA_OTHER)
    assert code == exits.EXIT_REFUSED
    [refusal] = _refusals(out)
    assert "workloads resnet-train, llm-decode never passed on nvidia 580.105.08 anywhere in the fleet" in refusal
    code, out = run_hook(root, HEAD + NVIDIA_UP)
    assert code == exits.EXIT_REFUSED
    [refusal] = _refusals(out)
    assert "workload resnet-train never passed on nvidia 580.159.04" in refusal


def test_an_amd_stack_is_matched_by_driver_and_rocm_release(tmp_path: Path) -> None:
    """amdgpu 6.10.5 with ROCm 6.3.1 verified for both: allowed; the same driver with ROCm 6.3.2 is refused."""
    root = _root(tmp_path, _listing(resnet_train=[AMD_6_10], llm_decode=[AMD_6_10, NVIDIA_580]), AMD_HOST)
    code, out = run_hook(root, HEAD + AMD_UP)
    assert code == exits.EXIT_ALLOW and not _refusals(out), out
    other = line("amdgpu-dkms", AMD_OLD, AMD_NEW) + line("rocm-core", ROCM_OLD, "6.3.2.60302-50~24.04")
    code, out = run_hook(root, HEAD + other)
    assert code == exits.EXIT_REFUSED and "never passed on amdgpu 6.10.5, ROCm 6.3.2" in out


@pytest.mark.parametrize("cached, why", [
    (None, "no verified list is cached on this host"),
    ("{not json", "not valid JSON"),
    ('{"format": 1, "fetched_at": null, "workloads": {}, "workloads": {}}', "not valid JSON"),
    (json.dumps({"format": 1, "fetched_at": None, "workloads": {"Resnet": []}}), "not a workload name"),
    (json.dumps({"format": 2, "fetched_at": None, "workloads": {}}), "format: 1 expected"),
    (json.dumps({"format": 1, "fetched_at": None, "workloads": {"resnet-train": [{"driver": "x"}]}}),
     "exactly driver and gpu_stack"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_no_list_or_a_damaged_one_refuses_stack_changes_only(tmp_path: Path, cached: Any, why: str) -> None:
    """Without a readable cached list a driver change is refused saying why (fail closed); an unrelated package
    still goes through."""
    root = _root(tmp_path)
    if cached is not None:
        path = root / "var/lib/gpuguard/workloads-verified.json"
        path.write_bytes(cached if isinstance(cached, bytes) else cached.encode())
    code, out = run_hook(root, HEAD + NVIDIA_UP)
    assert code == exits.EXIT_REFUSED
    [refusal] = _refusals(out)
    assert "cannot be checked against the workloads resnet-train, llm-decode" in refusal and why in refusal
    code, out = run_hook(root, HEAD + line("vim", "2:9.0.1378-2", "2:9.0.1378-3"))
    assert code == exits.EXIT_ALLOW, out


def test_a_fifo_in_place_of_the_list_refuses_at_once(tmp_path: Path) -> None:
    """A FIFO where the cached list belongs is unreadable, never waited on: the driver change is refused."""
    root = _root(tmp_path)
    os.mkfifo(root / "var/lib/gpuguard/workloads-verified.json")
    code, out = run_hook(root, HEAD + NVIDIA_UP)
    assert code == exits.EXIT_REFUSED and "not a regular file" in out


def test_the_dnf_checker_judges_the_same_rule_on_rpm(tmp_path: Path) -> None:
    """On rpm: nvidia-driver 580.105.08 is refused by the dnf checker naming the workloads and the stack; onto
    580.159.04, which both passed on, it is allowed."""
    import datetime as dt
    import io

    from agent.guard.dnf import check as dnf_check
    from agent.guard.dnf.request import request_document

    root = _root(tmp_path, _listing(resnet_train=[NVIDIA_580], llm_decode=[NVIDIA_580]))
    old = ("nvidia-driver", 3, "570.195.03", "1.el9", "x86_64")

    def checked(new_version: str) -> Tuple[int, str]:
        new = ("nvidia-driver", 3, new_version, "1.el9", "x86_64")
        err = io.StringIO()
        text = json.dumps(request_document([old], [new + ("in", "Upgrade"), old + ("out", "Upgraded")],
                                           command_line="dnf upgrade"))
        code = dnf_check.main(["--root", str(root)], stdin=io.BytesIO(text.encode()), err=err,
                              now=lambda: dt.datetime(2026, 12, 6, tzinfo=dt.timezone.utc))
        return code, err.getvalue()

    code, out = checked("580.105.08")
    assert code == exits.EXIT_REFUSED and "REFUSED (workloads.unverified)" in out
    assert "workloads resnet-train, llm-decode never passed on nvidia 580.105.08" in out
    assert checked("580.159.04")[0] == exits.EXIT_ALLOW
