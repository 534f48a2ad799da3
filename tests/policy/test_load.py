"""Loading policies: every problem at once as ``file: field -> 1: message``, merging, empty dirs, the CLI."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from agent.cli import main
from agent.errors import PolicyError
from agent.policy.load import compile_policy, load_policy

REPO = Path(__file__).resolve().parents[2]
GOOD = """
[policy]
name = "site"
[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"
"""
TYPE_ERRORS = """
[policy]
action = "explode"
max_override_minutes = "lots"
[[amd.pairing]]
name = "ok"
amdgpu = "6.2.*"
rocm = "6.2.*"
[[amd.pairing]]
name = "bad"
amdgpu = "< 6.3"
rocm = 62
kernels = []
[frozen]
packages = ["two words"]
"""


def test_shipped_example_policy_is_valid() -> None:
    """policies/example.toml loads, with its name and its eight rules."""
    loaded = load_policy(str(REPO / "policies/example.toml"))
    assert loaded.policy.policy.name == "mi300x-rocm-6.2" and loaded.policy.rule_count() == 8


def test_type_errors_are_all_reported_with_field_paths(tmp_path: Path) -> None:
    """Every type and spec error of a policy file is reported at once, each with its field path, under the file's
    name."""
    path = tmp_path / "p.toml"
    path.write_text(TYPE_ERRORS)
    with pytest.raises(PolicyError) as info:
        load_policy(str(path))
    problems = info.value.problems
    assert info.value.exit_code == 3 and info.value.path == str(path)
    assert any(p.startswith("policy -> action: Input should be 'warn', 'block' or 'rollback'") for p in problems)
    assert any(p.startswith("policy -> max_override_minutes:") for p in problems)
    assert "amd -> pairing -> 2 -> amdgpu: '< 6.3': use << or <= (and >> or >=); a single < or > is ambiguous " \
           "in dpkg" in problems
    assert any(p.startswith("amd -> pairing -> 2 -> rocm:") for p in problems)
    assert any(p.startswith("amd -> pairing -> 2 -> kernels: empty list") for p in problems)
    assert any(p.startswith("frozen -> packages: 'two words'") for p in problems)
    assert str(info.value).startswith(f"{path}: ")


def test_directory_merges_in_name_order_and_names_files(tmp_path: Path) -> None:
    """A policy directory merges its files in name order, and each file's problems are reported under its name."""
    (tmp_path / "10-base.toml").write_text(GOOD)
    (tmp_path / "20-more.toml").write_text('[policy]\nname = "override"\n[[amd.pairing]]\nname = "rocm-6.3"\n'
                                           'amdgpu = "6.3.*"\nrocm = "6.3.*"\n')
    loaded = load_policy(str(tmp_path))
    assert loaded.policy.policy.name == "override"
    assert [p.name for p in loaded.policy.amd.pairing] == ["rocm-6.2", "rocm-6.3"]
    assert [Path(s[0]).name for s in loaded.sources] == ["10-base.toml", "20-more.toml"]
    (tmp_path / "30-bad.toml").write_text("[policy\n")
    (tmp_path / "40-bad.toml").write_text('[kernel]\nallow = ">= "\n')
    with pytest.raises(PolicyError) as info:
        load_policy(str(tmp_path))
    assert info.value.problems[0].startswith("30-bad.toml: not valid TOML")
    assert info.value.problems[1].startswith("40-bad.toml: kernel -> allow: '>=': operator >= needs a version")


@pytest.mark.parametrize("setup,fragment", [
    (lambda d: None, "no policy files (*.toml) in this directory"),
    (lambda d: (d / "x.toml").write_text("[policy]\nname = 'empty'\n"), "defines no rules"),
    (lambda d: (d / "x.toml").write_text(GOOD + GOOD.replace("[policy]\nname = \"site\"", "")),
     "name 'rocm-6.2' is used more than once"),
])
def test_directory_level_problems(tmp_path: Path, setup, fragment: str) -> None:
    """An empty directory, a policy without rules and a pairing name used twice are each a PolicyError."""
    setup(tmp_path)
    with pytest.raises(PolicyError) as info:
        load_policy(str(tmp_path))
    assert fragment in str(info.value)


def test_missing_path_is_a_policy_error(tmp_path: Path) -> None:
    """A policy path that does not exist is a PolicyError saying so."""
    with pytest.raises(PolicyError, match="no such file or directory"):
        load_policy(str(tmp_path / "nope"))


def test_require_matrix_needs_the_matrix_to_compile(tmp_path: Path) -> None:
    """A policy with require_amd_matrix = true does not compile without the matrix."""
    path = tmp_path / "p.toml"
    path.write_text("[policy]\nrequire_amd_matrix = true\n")
    with pytest.raises(PolicyError, match="matrix is needed"):
        compile_policy(load_policy(str(path)), None)


def test_cli_policy_check_prints_every_problem_and_exits_3(tmp_path: Path) -> None:
    """policy check prints every problem on a line of its own under the file's name, then the count, and exits 3."""
    (tmp_path / "10-site.toml").write_text(TYPE_ERRORS)
    out = io.StringIO()
    assert main(["policy", "check", str(tmp_path)], out=out) == 3
    lines = out.getvalue().splitlines()
    assert lines[-1] == f"{len(lines) - 1} problems found"
    assert all(line.startswith(str(tmp_path / "10-site.toml") + ": ") for line in lines[:-1])
    assert f"{tmp_path / '10-site.toml'}: amd -> pairing -> 2 -> rocm: " in out.getvalue()


def test_cli_policy_check_ok(tmp_path: Path) -> None:
    """policy check on the shipped example says ok with the policy's name and exits 0."""
    out = io.StringIO()
    assert main(["policy", "check", str(REPO / "policies/example.toml")], out=out) == 0
    assert "ok: policy 'mi300x-rocm-6.2'" in out.getvalue()


def test_cli_policy_compile_writes_atomically(tmp_path: Path) -> None:
    """policy compile writes the compiled JSON to --output, creating its directory, and exits 0."""
    policy = tmp_path / "p.toml"
    policy.write_text(GOOD)
    target = tmp_path / "out/compiled.json"
    out = io.StringIO()
    assert main(["policy", "compile", "--policy", str(policy), "--output", str(target), "--config",
                 str(tmp_path / "none.toml")], out=out) == 0
    assert target.is_file() and '"format": 1' in target.read_text()
