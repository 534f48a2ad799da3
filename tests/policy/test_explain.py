"""``policy explain`` as a pure function: policy and host facts in, lines and current violations out."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from agent.guard.hotpath.overrides import OverrideWindow
from agent.hostfacts.context import HostContext
from agent.policy.compiled import CompiledPolicy
from agent.policy.explain import HostFacts, explain
from agent.policy.load import load_and_compile

POLICY = """
[policy]
name = "mi300x"
[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"
kernels = "6.8.0-*"
[frozen]
packages = ["rocm-core"]
[[nvidia.pairing]]
name = "r580"
driver = "580.*"
cuda = "13.0.*"
"""
PAIR = {"amdgpu-dkms": "1:6.8.5.60202-2041575.22.04", "rocm-core": "6.2.2.60202-116~22.04"}


def compiled(tmp_path: Path, action: str = "block") -> CompiledPolicy:
    path = tmp_path / "p.toml"
    path.write_text(POLICY.replace('name = "mi300x"', f'name = "mi300x"\naction = "{action}"'))
    return load_and_compile(str(path))[1]


def test_a_compliant_host_names_its_pinned_pairing_and_the_moves_it_may_make(tmp_path: Path) -> None:
    """The pinned pairing, every allowed move, the rules and 'compliant'."""
    result = explain(compiled(tmp_path), HostFacts(installed=PAIR, manager="dpkg",
                                                   context=HostContext("ubuntu", "22.04")))
    text = "\n".join(result.lines)
    assert result.violations == []
    assert "host: ubuntu 22.04" in text
    assert "AMD: amdgpu-dkms 1:6.8.5.60202-2041575.22.04 (driver 6.2.2), rocm-core 6.2.2.60202-116~22.04" in text
    assert "  pinned pairing: " in text and "none matches" not in text
    assert "frozen (must not move): rocm-core [block]" in text
    assert result.lines[-1] == "current state: compliant"


def test_a_loaded_driver_without_package_and_an_open_window_are_shown(tmp_path: Path) -> None:
    """The running NVIDIA module stands for a driver no package carries; open override windows are listed."""
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    window = OverrideWindow(id="w1", started_at=now, expires_at=now + dt.timedelta(hours=1), reason="upgrade",
                            opened_by="root")
    result = explain(compiled(tmp_path), HostFacts(installed={}, manager="dpkg",
                                                   context=HostContext(loaded_drivers={"nvidia": "580.159.04"}),
                                                   windows=[window]))
    assert "NVIDIA: loaded module 580.159.04 (no driver package: the policy judges the running module)" \
        in result.lines
    assert "NVIDIA: every driver part must be one build; several CUDA releases side by side are refused " \
           "(side_by_side = false)" in result.lines
    assert result.lines[-1].startswith("override window w1 open until 2026-01-01T01:00:00+00:00 ('upgrade', by root)")


def test_a_broken_pairing_is_a_violation(tmp_path: Path) -> None:
    """An installed pair outside every pairing is reported with its rule."""
    broken = {**PAIR, "rocm-core": "6.3.0.60300-39~22.04"}
    result = explain(compiled(tmp_path), HostFacts(installed=broken, manager="dpkg", windows_problem="bad JSON"))
    assert [v.rule for v in result.violations] == ["amd.pairing"]
    assert "  pinned pairing: none matches the installed pair (violation)" in result.lines
    assert "current state: 1 violation(s)" in result.lines
    assert result.lines[-1] == "override windows unreadable: bad JSON"


def test_a_mixed_classic_and_therock_host_shows_every_rocm_release(tmp_path: Path) -> None:
    """rocm-core 6.2.2 beside amdrocm-base7.13: both are listed, and no pairing accepts the sum (a violation)."""
    installed = {**PAIR, "amdrocm-base7.13": "7.13.0-1"}
    result = explain(compiled(tmp_path), HostFacts(installed=installed, manager="dpkg"))
    assert "AMD: amdgpu-dkms 1:6.8.5.60202-2041575.22.04 (driver 6.2.2), amdrocm-base7.13 7.13.0-1 (ROCm 7.13.0), " \
           "rocm-core 6.2.2.60202-116~22.04 (ROCm 6.2.2)" in result.lines
    assert "  pinned pairing: none matches the installed pair (violation)" in result.lines
    assert [v.rule for v in result.violations] == ["amd.pairing"]


def test_a_bypass_since_the_known_good_set_is_judged_as_rollback_judges_it(tmp_path: Path) -> None:
    """A frozen package removed behind apt's back (dpkg -r --force-depends): the standing set alone looks
    compliant, the change from the known-good set is the frozen rule's violation, and the move is named."""
    now = {"amdgpu-dkms": PAIR["amdgpu-dkms"]}
    policy = compiled(tmp_path, action="rollback")
    standing = explain(policy, HostFacts(installed=now, manager="dpkg"))
    assert [v.rule for v in standing.violations] == ["amd.pairing"]  # rocm-core absent breaks the pairing too
    result = explain(policy, HostFacts(installed=now, manager="dpkg", known_good=PAIR))
    assert sorted(v.rule for v in result.violations) == ["amd.pairing", "frozen"]
    assert "since the known-good set: rocm-core 6.2.2.60202-116~22.04 -> (removed)" in result.lines
    unchanged = explain(policy, HostFacts(installed=PAIR, manager="dpkg", known_good=PAIR))
    assert unchanged.violations == [] and not any(line.startswith("since the") for line in unchanged.lines)


def test_a_change_the_guard_only_reports_is_said_not_counted(tmp_path: Path) -> None:
    """Under a blocking policy guard rollback reports a bypass and undoes nothing: explain says so in a line and
    counts only the standing violations (a host changed behind the guard, then frozen, stays compliant)."""
    installed = {**PAIR, "rocm-core": "6.2.2.60202-117~22.04"}
    result = explain(compiled(tmp_path), HostFacts(installed=installed, manager="dpkg", known_good=PAIR))
    assert result.violations == []
    assert any(line.startswith("  reported by the guard, not undone: frozen [block]: rocm-core is frozen")
               for line in result.lines), result.lines


def test_an_unreadable_known_good_set_is_one_line(tmp_path: Path) -> None:
    """A corrupt known-good file is said in one line; the standing set is judged as before."""
    result = explain(compiled(tmp_path), HostFacts(installed=PAIR, manager="dpkg",
                                                   known_good_problem="known-good.json: corrupt"))
    assert "known-good set unreadable: known-good.json: corrupt" in result.lines and result.violations == []


def test_explain_shows_the_dates_of_gpuguards_compatibility_tables(tmp_path: Path) -> None:
    """Every explanation names the tables its rules judge with: the dcgm-exporter table's version, date, origin and
    newest row where the companions rule reads it (none otherwise), the TheRock table's version, date, origin and
    newest row; with
    require_amd_matrix the AMD matrix's recorded date too."""
    from agent.policy.load import compiled_from, load_policy
    from agent.policy.matrix import load_matrix

    plain = explain(compiled(tmp_path), HostFacts(installed=PAIR, manager="dpkg")).lines
    therock = "TheRock release table version 1 dated 2026-12-06 (from package; newest row: 10.1)"
    assert plain[2] == f"gpuguard's compatibility tables: {therock}"
    exporter = tmp_path / "e.toml"
    exporter.write_text("[companions]\ndcgm_exporter = true\n")
    judged = explain(compiled_from(load_policy(str(exporter))), HostFacts(installed=PAIR, manager="dpkg")).lines
    assert judged[2] == ("gpuguard's compatibility tables: dcgm-exporter table version 2 dated 2026-12-06 (from "
                         f"package; newest row: exporter 4.10.0 with DCGM 4.8.0); {therock}")
    path = tmp_path / "m.toml"
    path.write_text('[policy]\nrequire_amd_matrix = true\n[amd]\n[[amd.pairing]]\nname = "any"\namdgpu = "any"\n'
                    'rocm = "any"\n')
    matrix = load_matrix()
    with_matrix = explain(compiled_from(load_policy(str(path)), matrix), HostFacts(installed=PAIR, manager="dpkg"))
    assert with_matrix.lines[2] == (f"gpuguard's compatibility tables: {therock}; AMD compatibility matrix recorded "
                                    f"{matrix.recorded}")


def test_explain_names_versions_newer_than_amds_matrix_and_the_therock_table(tmp_path: Path) -> None:
    """TheRock 10.2 (amdrocm-base10.2) on amdgpu 31.60 with a gfx1250 GPU under require_amd_matrix: info lines
    unknown to the matrix (ROCm, driver, GPU) and to the TheRock release table, each naming its table's date."""
    from agent.policy.knowledge_files import therock_table_in_use
    from agent.policy.load import compiled_from, load_policy
    from agent.policy.matrix import load_matrix

    path = tmp_path / "m.toml"
    path.write_text('[policy]\nrequire_amd_matrix = true\n[amd]\n[[amd.pairing]]\nname = "any"\namdgpu = "any"\n'
                    'rocm = "any"\n')
    matrix = load_matrix()
    installed = {"amdgpu-dkms": "1:7.1.9.31600000-2403767.26.04", "amdrocm-base10.2": "10.2.0~20261201-1"}
    lines = explain(compiled_from(load_policy(str(path)), matrix),
                    HostFacts(installed=installed, manager="dpkg",
                              context=HostContext(gpu_targets=("gfx1250",)))).lines
    unknown = [line.strip() for line in lines if "unknown to gpuguard's" in line]
    dated = f"AMD compatibility matrix dated {matrix.recorded}"
    assert [line.split(" is unknown")[0] for line in unknown] == [  # the [amd] family's lines, then the matrix's
        "TheRock ROCm 10.2 (amdrocm-base10.2)", "ROCm 10.2 (amdrocm-base10.2)", "amdgpu driver 31.60 (amdgpu-dkms)",
        "GPU target gfx1250"]
    assert all(line.endswith("[info]") for line in unknown)
    assert sum(dated in line for line in unknown) == 3
    assert sum(f"TheRock release table dated {therock_table_in_use().dated}" in line for line in unknown) == 1
