"""gpuguard pin apply on a zypper host writes zypper locks that real zypper honours; the pure merge keeps others'."""

from __future__ import annotations

import subprocess

from agent.guard.pin_records import Pin
from agent.guard.zypper.locks import BEGIN, END, lock_block, lock_blocks, merge_locks, parse_locks, parse_search_xml
from tests.guard.zypper.conftest import AMDGPU_63, BASELINE, CUDA_131, HELLO_11
from tests.guard.zypper.harness import ZypperHost

OPERATOR = """type: package
match_type: glob
case_sensitive: on
solvable_name: kernel-default
"""


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


def test_pin_apply_writes_locks_that_keep_zypper_update_from_moving_the_stack(host: ZypperHost) -> None:
    """pin apply locks away the builds the policy forbids (amdgpu 6.3 beside ROCm 6.2, CUDA 13.1, the newer NVIDIA
    driver); zypper update then moves only the harmless package and exits 0, no refusal needed."""
    host.write("/etc/zypp/locks", OPERATOR)
    result = host.gpuguard("pin", "apply")
    assert result.returncode == 0, output(result)
    assert "wrote /etc/zypp/locks" in result.stdout and "other locks left alone" in result.stdout
    text = host.read("/etc/zypp/locks") or ""
    assert text.startswith(OPERATOR) and BEGIN in text and END in text
    assert f"version: == {AMDGPU_63}\nmatch_type: glob\ncase_sensitive: on\nsolvable_name: amdgpu-dkms" in text
    assert f"version: == {CUDA_131}" in text
    update = host.zypper("update")
    assert update.returncode == 0, output(update)
    assert "REFUSED" not in output(update)
    assert host.installed() == {**BASELINE, "hello-fake": HELLO_11}


def test_pin_apply_twice_changes_nothing(host: ZypperHost) -> None:
    """A second pin apply finds its locks in place and writes nothing."""
    assert host.gpuguard("pin", "apply").returncode == 0
    first = host.read("/etc/zypp/locks")
    again = host.gpuguard("pin", "apply")
    assert again.returncode == 0 and "unchanged /etc/zypp/locks" in again.stdout, output(again)
    assert host.read("/etc/zypp/locks") == first


def test_merge_replaces_only_gpuguards_blocks() -> None:
    """The operator's locks stay, gpuguard's old block is replaced, a lock equal to one of ours is not doubled."""
    ours = lock_blocks([Pin("rocm-core", "6.2.2.60202-116.sles15", 1001, "frozen: pairing rocm-6.2")], [])
    stale = "\n".join(["", BEGIN, "", "type: package", "solvable_name: amdgpu-dkms", "", END])
    unmarked = "\n" + "\n".join(f"{k}: {v}" for k, v in lock_block("rocm-core", "6.2.2.60202-116.sles15")) + "\n"
    text, before, after = merge_locks(OPERATOR + stale + unmarked, ours, "policy 't'")
    outside, inside = parse_locks(text)
    assert outside == [tuple((k, v) for k, v in parse_locks(OPERATOR)[0][0])]
    assert inside == [lock_block("rocm-core", "6.2.2.60202-116.sles15")]
    assert len(before) == 2 and after == inside
    assert merge_locks(OPERATOR, [], "x")[0].strip() == OPERATOR.strip()


def test_search_xml_gives_versions_per_name() -> None:
    """zypper --xmlout search -s answers are read into name -> editions, progress lines before them ignored."""
    xml = ("<?xml version='1.0'?>\n<stream>\n<message type=\"info\">Loading</message>\n<search-result><solvable-list>"
           "<solvable status=\"not-installed\" name=\"rocm-core\" kind=\"package\" edition=\"6.3.0-1\" arch=\"x\"/>"
           "<solvable status=\"installed\" name=\"rocm-core\" kind=\"package\" edition=\"6.2.2-1\" arch=\"x\"/>"
           "<solvable name=\"p\" kind=\"patch\" edition=\"1\"/></solvable-list></search-result></stream>")
    assert parse_search_xml(xml) == {"rocm-core": ["6.3.0-1", "6.2.2-1"]}
