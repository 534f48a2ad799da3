"""The workloads family: a driver/ROCm/CUDA change judged against the hub's verified stacks of the named workloads,
and the strict parser of the cached list (the hook-level tests are tests/guard/apt/test_hook_workloads.py)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest

from agent.hostfacts.context import HostContext
from agent.hostfacts.verified_stacks import (
    VerifiedStack,
    VerifiedStacks,
    parse_verified_stacks,
    read_verified_stacks,
)
from agent.policy.compiled import CompiledPolicy
from agent.policy.evaluate import evaluate
from agent.policy.families import HostState
from agent.policy.families.workloads import explain, matches

POLICY = CompiledPolicy({"name": "t", "action": "block", "kernel_packages": [], "guarded": [],
                         "workloads": {"verified": ["resnet-train"], "action": None}})
NV_570 = {"nvidia-driver-570": "570.195.03-0ubuntu1"}
NV_580 = {"nvidia-driver-580": "580.159.04-0ubuntu1"}
AMD_OLD = {"amdgpu-dkms": "1:6.8.5.60202-2041575.24.04", "rocm-core": "6.2.2.60202-116~24.04"}
AMD_NEW = {"amdgpu-dkms": "1:6.10.5.60301-2118443.24.04", "rocm-core": "6.3.1.60301-48~24.04"}
ON_580 = VerifiedStack("nvidia 580.159.04", "CUDA 13.0")
ON_AMD = VerifiedStack("amdgpu 6.10.5", "ROCm 6.3.1")


def judged(before: Dict[str, str], after: Dict[str, str], cached: Optional[VerifiedStacks]) -> List[str]:
    state = HostState(before, after, "dpkg", HostContext(verified_stacks=cached))
    return [f"{v.rule}: {v.message}" for v in evaluate(state, POLICY)]


def listing(*stacks: VerifiedStack, name: str = "resnet-train") -> VerifiedStacks:
    return VerifiedStacks(((name, stacks),), "2026-12-06T19:00:00.000000Z")


@pytest.mark.parametrize("before, after, cached, rule", [
    (NV_570, NV_580, listing(ON_580), None),                                  # verified: allowed
    (NV_570, NV_580, listing(ON_AMD), "workloads.unverified"),                # only another stack verified
    (NV_570, NV_580, listing(ON_580, name="llm-decode"), "workloads.unverified"),  # another workload's pass
    (NV_570, NV_580, None, "workloads.unverifiable"),                         # no list cached
    (NV_570, NV_580, VerifiedStacks(problem="p: damaged"), "workloads.unverifiable"),
    (AMD_OLD, AMD_NEW, listing(ON_AMD), None),
    (AMD_OLD, {**AMD_NEW, "rocm-core": "6.3.2.60302-50~24.04"}, listing(ON_AMD), "workloads.unverified"),
    (NV_570, NV_570, None, None),                                             # nothing moved: not judged
    (NV_570, {}, None, None),                                                 # removal: nothing to verify
    ({**NV_570, "vim": "1"}, {**NV_570, "vim": "2"}, None, None),             # an unrelated package
])
def test_the_stack_a_change_leaves_must_be_verified(before: Dict[str, str], after: Dict[str, str],
                                                    cached: Optional[VerifiedStacks], rule: Optional[str]) -> None:
    """A change is allowed onto a stack the named workload passed on, refused onto any other or without a readable
    list, and not judged when the stack does not move or is removed."""
    found = judged(before, after, cached)
    assert [f.split(":")[0] for f in found] == ([rule] if rule else [])


def test_the_refusal_names_the_workload_and_the_stack() -> None:
    """The message names the workload, the stack left and the list's time; the damaged list's problem is said."""
    [found] = judged(NV_570, NV_580, listing(ON_AMD))
    assert found == ("workloads.unverified: workload resnet-train never passed on nvidia 580.159.04 anywhere in "
                     "the fleet (the hub's verified list of 2026-12-06T19:00:00.000000Z)")
    [found] = judged(NV_570, NV_580, VerifiedStacks(problem="p: damaged"))
    assert found.endswith("cannot be checked against the workloads resnet-train: p: damaged")


@pytest.mark.parametrize("verified, stack, expected", [
    (ON_580, ("580.159.04", None, None), True),
    (ON_580, ("580.105.08", None, None), False),
    (ON_AMD, (None, "6.10.5", "6.3.1"), True),
    (ON_AMD, (None, "6.10.5", None), True),                 # no ROCm on the host: not compared
    (ON_AMD, (None, "6.8.5", "6.3.1"), False),
    (VerifiedStack("amdgpu 6.10.5 nvidia 580.159.04", "ROCm 6.3.1 CUDA 13.0"), ("580.159.04", "6.10.5", "6.3.1"),
     True),
    (VerifiedStack(None, None), ("580.159.04", None, None), False),
])
def test_a_verified_stack_matches_release_for_release(verified: VerifiedStack, stack: Any, expected: bool) -> None:
    """Each part the host has is compared with the verified stack's release of it; a part it lacks is not."""
    assert matches(verified, stack) is expected


def test_explain_says_whether_the_installed_stack_is_verified() -> None:
    """policy explain names the workloads and whether the installed stack is one of each one's verified stacks."""
    lines = explain(POLICY, NV_580, "dpkg", HostContext(verified_stacks=listing(ON_580)))
    assert lines[1] == "  resnet-train: 1 verified stack(s); the installed nvidia 580.159.04 is one of them"
    assert "none cached" in explain(POLICY, NV_580, "dpkg", HostContext())[1]


GOOD = {"format": 1, "fetched_at": "t", "workloads": {"resnet-train": [{"driver": "nvidia 1", "gpu_stack": None}]}}


@pytest.mark.parametrize("data, problem", [
    ({**GOOD, "extra": 1}, "exactly format, fetched_at and workloads"),
    ({**GOOD, "format": True}, "format"),
    ({**GOOD, "workloads": {"a": [{"driver": "x" * 301, "gpu_stack": None}]}}, "workloads -> a -> 1 -> driver"),
    ({**GOOD, "workloads": {"a": [{"driver": 5, "gpu_stack": None}]}}, "driver"),
    ({**GOOD, "workloads": {"a": [{}] * 513}}, "at most 512 stacks"),
    ({**GOOD, "workloads": {f"w{i}": [] for i in range(257)}}, "at most 256 workloads"),
    ({**GOOD, "workloads": []}, "workloads"),
])
def test_the_cached_list_is_parsed_strictly(data: Any, problem: str) -> None:
    """Unknown keys, wrong types, over-long texts and too many entries are refused naming the field."""
    with pytest.raises(ValueError, match=problem):
        parse_verified_stacks(data)
    assert parse_verified_stacks(GOOD).stacks_of("resnet-train") == (VerifiedStack("nvidia 1", None),)


def test_a_missing_list_is_none_and_an_oversized_one_a_problem(tmp_path: Any) -> None:
    """No file reads as None (nothing cached); a file over 1 MiB is a problem, not read."""
    assert read_verified_stacks(str(tmp_path), "/var/lib/gpuguard/workloads-verified.json") is None
    path = tmp_path / "var/lib/gpuguard/workloads-verified.json"
    path.parent.mkdir(parents=True)
    path.write_text(" " * ((1 << 20) + 1))
    found = read_verified_stacks(str(tmp_path), "/var/lib/gpuguard/workloads-verified.json")
    assert found is not None and found.problem is not None and found.workloads == ()
