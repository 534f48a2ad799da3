"""``[[bake]]``: a version moved to is refused until it has been public ``min_age_days`` days, counted from the date
the signed deny list carries for it; the refusal says its age and the day it is allowed; no known date refuses."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import List, Optional

import pytest

from agent.bundle.deny import DENY_FORMAT, DenyList, render_deny
from agent.policy.compiled import CompiledPolicy, check_compiled
from agent.policy.evaluate import HostState, evaluate
from agent.policy.load import compile_policy, load_policy

POLICY = """\
[policy]
name = "baked"
[[bake]]
name = "drivers"
family = "driver"
min_age_days = 7
[[bake]]
family = "firmware"
packages = ["firmware-amd-graphics"]
min_age_days = 3
action = "warn"
"""


def compiled(tmp_path: Path, published: List[List[str]]) -> CompiledPolicy:
    """POLICY compiled, with the dates a deny list would put in."""
    path = tmp_path / "bake.toml"
    path.write_text(POLICY)
    data = compile_policy(load_policy(str(path)))
    data["bake"]["published"] = published
    return check_compiled(json.loads(json.dumps(data)), "<test>")


def days_ago(days: int, today: Optional[dt.date] = None) -> str:
    return ((today or dt.datetime.now(dt.timezone.utc).date()) - dt.timedelta(days=days)).isoformat()


@pytest.mark.parametrize("age,refused", [(2, True), (6, True), (7, False), (30, False), (None, True)])
def test_a_driver_version_is_refused_until_it_has_baked(tmp_path: Path, age: Optional[int], refused: bool) -> None:
    """amdgpu-dkms (the driver family's default globs) moving to a version public ``age`` days: refused under 7
    days with its age and the day it is allowed, allowed from then on; with no date known, refused."""
    state = HostState({"amdgpu-dkms": "1:6.8.5.60202-1"}, {"amdgpu-dkms": "1:6.10.5.60300-1"})
    while True:  # judged again if UTC midnight passed between reading the date and the rule's own reading of it
        day = dt.datetime.now(dt.timezone.utc).date()
        published = [] if age is None else [["amdgpu-dkms", "1:6.10.5.60300-1", days_ago(age, day)]]
        found = evaluate(state, compiled(tmp_path, published))
        if dt.datetime.now(dt.timezone.utc).date() == day:
            break
    assert [v.rule for v in found] == (["bake.drivers"] if refused else [])
    if refused and age is not None:
        allowed = (day - dt.timedelta(days=age) + dt.timedelta(days=7)).isoformat()
        assert found[0].message == (f"amdgpu-dkms 1:6.10.5.60300-1 was published {days_ago(age, day)}, {age} days ago: "
                                    f"rule 'drivers' asks 7 days of bake time, so it is allowed from {allowed}")
        assert found[0].action == "block"
    if refused and age is None:
        assert "has no public date known" in found[0].message


def test_what_is_installed_already_and_other_families_are_not_judged(tmp_path: Path) -> None:
    """A version installed before (standing) and a package no rule covers pass; the firmware rule's own globs and
    action apply."""
    installed = {"amdgpu-dkms": "1:6.8.5.60202-1", "vim": "2:9.0-1"}
    policy = compiled(tmp_path, [])
    assert evaluate(HostState.standing(installed), policy) == []
    assert evaluate(HostState(installed, {**installed, "vim": "2:9.1-1"}), policy) == []
    moved = HostState(installed, {**installed, "firmware-amd-graphics": "20240101-1"})
    [violation] = evaluate(moved, policy)
    assert (violation.rule, violation.action) == ("bake.bake[1]", "warn")


def test_the_dates_travel_in_the_signed_deny_list_and_render_additively() -> None:
    """A deny list without dates renders without the field (its bytes as before); with dates, they are kept."""
    plain = DenyList.model_validate({"format": DENY_FORMAT, "serial": 1, "issued_at": "2026-12-05T00:00:00Z"})
    assert b"published" not in render_deny(plain)
    dated = DenyList.model_validate({"format": DENY_FORMAT, "serial": 1, "issued_at": "2026-12-05T00:00:00Z",
                                     "published": [{"package": "hello", "version": "1.1-1", "date": "2026-12-01"}]})
    assert json.loads(render_deny(dated))["published"] == [{"date": "2026-12-01", "package": "hello",
                                                            "version": "1.1-1"}]
