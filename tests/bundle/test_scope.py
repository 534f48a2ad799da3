"""A bundle's scope over a host's facts: pure, every given selector must match, the first failing one named."""

from __future__ import annotations

from typing import Any, Dict, Optional

import pytest

from agent.bundle.format import BundleScope
from agent.bundle.scope import ScopeFacts, pairing_text, scope_facts, scope_refusal
from agent.snapshot.pairing import Pairing

FACTS = ScopeFacts(host_id="h1", labels={"rack": "a7", "role": "train"}, gpu_models=("NVIDIA H200", "NVIDIA A100"),
                   os="ubuntu-24.04", pairing="nvidia 580.95.05 cuda 13.0")


@pytest.mark.parametrize(("scope", "refusal"), [
    ({"all": True}, None),
    ({"host_ids": ["h1"]}, None),
    ({"host_ids": ["h*"], "labels": {"rack": "a7"}, "gpu_models": ["*H200*"], "os": ["ubuntu-24.*"],
      "pairings": ["nvidia 580.*"]}, None),
    ({"host_ids": ["h2", "h3"]}, "out of scope: host id h1 matches none of host_ids [h2, h3]"),
    ({"labels": {"rack": "b1"}}, "out of scope: label rack is 'a7', the bundle is for rack='b1'"),
    ({"labels": {"zone": "z"}}, "out of scope: label zone is not set, the bundle is for zone='z'"),
    ({"gpu_models": ["*MI300X*"]},
     "out of scope: GPU models (NVIDIA H200, NVIDIA A100) match none of gpu_models [*MI300X*]"),
    ({"os": ["rhel-9.*"]}, "out of scope: os ubuntu-24.04 matches none of os [rhel-9.*]"),
    ({"pairings": ["nvidia 570.*"]},
     "out of scope: pairing 'nvidia 580.95.05 cuda 13.0' matches none of pairings [nvidia 570.*]"),
    ({"host_ids": ["h1"], "os": ["rhel-9.*"]}, "out of scope: os ubuntu-24.04 matches none of os [rhel-9.*]"),
    ({"gpu_models": ["*h200*"]}, "out of scope: GPU models"),
])
def test_every_given_selector_must_match(scope: Dict[str, Any], refusal: Optional[str]) -> None:
    """``all`` takes every host; otherwise each selector (AND) must match, lists by any glob, labels by equality."""
    got = scope_refusal(BundleScope.model_validate(scope), FACTS)
    assert (got is None) if refusal is None else (got is not None and got.startswith(refusal)), got


def test_an_unknown_fact_matches_no_selector() -> None:
    """A host whose OS, GPUs or pairing are unknown is out of scope of a selector on them, and says unknown."""
    bare = ScopeFacts(host_id="h1")
    assert scope_refusal(BundleScope(os=("*",)), bare) == "out of scope: os unknown matches none of os [*]"
    assert scope_refusal(BundleScope(pairings=("*",)), bare) == ("out of scope: pairing unknown matches none of "
                                                                 "pairings [*]")
    assert scope_refusal(BundleScope(gpu_models=("*",)), bare) == ("out of scope: GPU models (none known) match "
                                                                   "none of gpu_models [*]")
    assert scope_refusal(BundleScope(all=True), bare) is None


def test_facts_come_from_a_heartbeat_pairing() -> None:
    """The OS is ``id-version``, the GPU models the pairing's list, the pairing its short text, AMD first."""
    pairing = Pairing(os_id="ubuntu", os_version_id="22.04", amdgpu_loaded="6.8.5", rocm="6.2.2",
                      gpu_models="AMD Instinct MI300X, AMD Instinct MI250")
    facts = scope_facts("h9", {"rack": "c"}, pairing)
    assert facts == ScopeFacts(host_id="h9", labels={"rack": "c"}, os="ubuntu-22.04",
                               gpu_models=("AMD Instinct MI300X", "AMD Instinct MI250"),
                               pairing="amdgpu 6.8.5 rocm 6.2.2")
    assert scope_facts("h9", {}, None) == ScopeFacts(host_id="h9")
    assert pairing_text(Pairing()) is None
    assert pairing_text(Pairing(nvidia_loaded="580.95.05", cuda_driver_api="13.0")) == "nvidia 580.95.05 cuda 13.0"
