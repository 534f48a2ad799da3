"""The policy's [health] table: after_change validated strictly, compiled for the daemon, files that disagree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.errors import PolicyError
from agent.policy.compiled import check_compiled
from agent.policy.load import compiled_from, load_policy
from agent.policy.semantic import WARNING, check_policy

BASE = '[policy]\nname = "t"\n[frozen]\npackages = ["amdgpu-dkms"]\n'


def _compiled(tmp_path: Path, text: str):
    path = tmp_path / "10-site.toml"
    path.write_text(text)
    return compiled_from(load_policy(str(path)))


def test_default_is_alert_and_rollback_is_compiled(tmp_path: Path) -> None:
    """[health] after_change defaults to alert, and rollback is carried into the compiled policy."""
    assert _compiled(tmp_path, BASE).health_after_change == "alert"
    compiled = _compiled(tmp_path, BASE + '[health]\nafter_change = "rollback"\n')
    assert compiled.health_after_change == "rollback"
    assert compiled.data["health"] == {"after_change": "rollback"}


@pytest.mark.parametrize("value", ['"rolback"', "true", '"Rollback"'])
def test_other_values_are_refused(tmp_path: Path, value: str) -> None:
    """A misspelt, capitalised or non-string after_change is a PolicyError at health -> after_change."""
    with pytest.raises(PolicyError) as caught:
        _compiled(tmp_path, BASE + f"[health]\nafter_change = {value}\n")
    assert any("health -> after_change" in p for p in caught.value.problems), caught.value.problems


def test_unknown_key_in_health_is_refused(tmp_path: Path) -> None:
    """An unknown key in [health] is a PolicyError naming it."""
    with pytest.raises(PolicyError) as caught:
        _compiled(tmp_path, BASE + '[health]\nafter_chnage = "rollback"\n')
    assert any("after_chnage" in p for p in caught.value.problems), caught.value.problems


def test_a_compiled_document_with_a_bad_value_is_refused(tmp_path: Path) -> None:
    """A compiled policy whose health after_change is not a known value is refused naming the field."""
    data = json.loads(json.dumps(_compiled(tmp_path, BASE).data))
    data["health"] = {"after_change": "reboot"}
    with pytest.raises(Exception, match="health -> after_change"):
        check_compiled(data, "policy.compiled.json")


def test_files_that_disagree_are_a_warning_on_the_overridden_one(tmp_path: Path) -> None:
    """Policy files that set after_change differently warn on the overridden one; the last in name order wins."""
    (tmp_path / "10-a.toml").write_text(BASE + '[health]\nafter_change = "rollback"\n')
    (tmp_path / "20-b.toml").write_text('[health]\nafter_change = "alert"\n')
    (tmp_path / "30-c.toml").write_text("[health]\n")  # sets nothing: no opinion, no warning
    loaded = load_policy(str(tmp_path))
    assert loaded.policy.health is not None and loaded.policy.health.after_change == "alert"
    problems = [p for p in check_policy(loaded.parts, loaded.policy) if p.where.startswith("health")]
    assert [(Path(p.file).name, p.severity) for p in problems] == [("10-a.toml", WARNING)]
    assert "'rollback' is overridden by a later file" in problems[0].message
