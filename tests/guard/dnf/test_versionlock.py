"""Rendering dnf versionlock entries from the policy and merging them with the operator's own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.errors import InputFileError
from agent.guard.dnf.tool import DnfTool
from agent.guard.dnf.versionlock import (
    BEGIN,
    END,
    apply_versionlock,
    dnf4_entries,
    dnf5_packages,
    merge_dnf4,
    merge_dnf5,
    parse_dnf5,
    split_managed_block,
)
from agent.guard.pin_records import Pin, pin_records
from agent.host import Host
from agent.policy.load import compiled_from, load_policy
from tests.fakes.runner import FakeRunner

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

POLICY = """
[policy]
name = "vl"
[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"
kernels = ["5.14.0-427.*", "5.14.0-503.*"]
[frozen]
packages = ["rocm-core"]
"""
D62, D63 = "1:6.8.5.60202-2041575.el9", "1:6.10.5.60300-2084815.el9"
R62, R63 = "6.2.2.60202-116.el9", "6.3.0.60300-39.el9"
INSTALLED = {"amdgpu-dkms": D62, "rocm-core": R62, "kernel-core@5.14.0-427.el9": "5.14.0-427.el9"}
AVAILABLE = {"amdgpu-dkms": [D62, D63], "rocm-core": [R62, R63],
             "kernel-core": ["5.14.0-427.el9", "5.14.0-503.el9", "5.14.0-570.el9"]}


def _policy(tmp_path: Path):
    path = tmp_path / "p.toml"
    path.write_text(POLICY)
    return compiled_from(load_policy(str(path)))


def test_records_lock_frozen_builds_and_forbid_unsupported_rpm_kernels(tmp_path: Path) -> None:
    """rpm kernels share a name: every build but the installed ones is a new kernel, checked against the pairing."""
    frozen, forbidden = pin_records(_policy(tmp_path), INSTALLED, AVAILABLE, manager="rpm", context=None)
    assert [(p.package, p.version) for p in frozen] == [("rocm-core", R62)]
    assert sorted((p.package, p.version) for p in forbidden) == [
        ("amdgpu-dkms", D63), ("kernel-core", "5.14.0-570.el9"), ("rocm-core", R63)]


def test_dnf4_entries_spell_out_the_epoch_and_skip_excludes_of_a_locked_name() -> None:
    """dnf4 versionlock entries write the epoch, each with its reason, and leave out excludes of a locked name."""
    frozen = [Pin("rocm-core", R62, 1001, "frozen by policy")]
    forbidden = [Pin("rocm-core", R63, -1, "x"), Pin("amdgpu-dkms", D63, -1, "driver release 6.3.0 is in no pairing"),
                 Pin("kernel-core", "5.14.0-570.el9", -1, "kernel")]
    assert dnf4_entries(frozen, forbidden) == [
        "# frozen by policy", f"rocm-core-0:{R62}.*", "# driver release 6.3.0 is in no pairing",
        f"!amdgpu-dkms-{D63}.*", "# kernel", "!kernel-core-0:5.14.0-570.el9.*"]


def test_merge_dnf4_keeps_operator_lines_and_replaces_or_drops_the_managed_block() -> None:
    """Only the lines between gpuguard's markers change; with no entries the block goes, the operator's stay."""
    operator = "# mine\nbash-0:5.1.8-6.el9.*\n!hello-0:2-1.*\n"
    existing = (operator + f"\n{BEGIN}\n# old stamp\n!stale-0:1-1.*\n{END}\n"
                "# after the block, also mine\nzsh-0:5.8-1.*\n")
    merged = merge_dnf4(existing, ["!new-0:1-1.*"], "# stamp")
    outside, inside = split_managed_block(merged)
    assert outside == ["# mine", "bash-0:5.1.8-6.el9.*", "!hello-0:2-1.*", "", "# after the block, also mine",
                       "zsh-0:5.8-1.*", ""]
    assert inside == ["# stamp", "!new-0:1-1.*"]
    assert merge_dnf4(merged, ["!new-0:1-1.*"], "# stamp") == merged
    dropped = merge_dnf4(merged, [], "# stamp")
    assert BEGIN not in dropped and "zsh-0:5.8-1.*" in dropped and "!new" not in dropped
    assert merge_dnf4("", [], "# stamp") == ""
    assert split_managed_block(f"a\n{BEGIN}\nb\n")[1] == ["b"]  # an unclosed block is still gpuguard's


DNF5_EXISTING = """\
version = "1.0"

# a TOML comment dnf5 itself would drop
[[packages]]
name = "bash"
comment = "Added by 'versionlock add' command on 2025-01-11 10:25:23"
[[packages.conditions]]
key = "evr"
comparator = "="
value = "5.2.15-5.fc39"

[[packages]]
name = "old"
comment = "gpuguard: forbidden: stale"
[[packages.conditions]]
key = "evr"
comparator = "!="
value = "1-1"
"""


def test_merge_dnf5_keeps_other_entries_and_replaces_gpuguards(tmp_path: Path) -> None:
    """Entries whose comment starts with 'gpuguard: ' are replaced; the forbidden builds of a name are one entry."""
    ours = dnf5_packages([Pin("rocm-core", R62, 1001, "frozen by policy")],
                         [Pin("kernel-core", "5.14.0-570.el9", -1, "k"), Pin("kernel-core", "0:5.14.0-600.el9", -1,
                                                                             "k")])
    text, before, after = merge_dnf5(DNF5_EXISTING, ours, "versionlock.toml")
    assert (before, after) == (1, 2)
    doc = tomllib.loads(text)
    assert doc["version"] == "1.0"
    assert [p["name"] for p in doc["packages"]] == ["bash", "rocm-core", "kernel-core"]
    assert doc["packages"][0]["conditions"] == [{"key": "evr", "comparator": "=", "value": "5.2.15-5.fc39"}]
    assert doc["packages"][1]["comment"] == "gpuguard: frozen by policy"
    assert doc["packages"][2]["conditions"] == [{"key": "evr", "comparator": "!=", "value": "5.14.0-570.el9"},
                                                {"key": "evr", "comparator": "!=", "value": "5.14.0-600.el9"}]
    assert merge_dnf5(text, ours, "v")[0] == text
    assert merge_dnf5("", [], "v")[0] == ""


@pytest.mark.parametrize("text,message", [
    ("version = \"1.0\"\n[[packages]\n", "not valid TOML"),
    ("version = \"2.0\"\n", "version '2.0' is not '1.0'"),
    ("version = \"1.0\"\npackages = 3\n", "packages is not an array of tables"),
])
def test_a_versionlock_toml_gpuguard_cannot_read_is_left_alone_with_one_line(text: str, message: str) -> None:
    """A versionlock.toml that is not TOML or not of the known format is left alone, said in one line."""
    with pytest.raises(InputFileError, match=message) as caught:
        parse_dnf5(text, "/etc/dnf/versionlock.toml")
    assert "\n" not in str(caught.value) and "left it alone" in str(caught.value)


def _host(tmp_path: Path, dnf5: bool):
    root = tmp_path / "root"
    (root / "etc/dnf/plugins").mkdir(parents=True)
    if dnf5:
        (root / "usr/bin").mkdir(parents=True)
        (root / "usr/bin/dnf5").write_text("#!/bin/sh\n")
        os.chmod(root / "usr/bin/dnf5", 0o755)
    runner = FakeRunner()
    host = Host(root=root, runner=runner)
    tool = DnfTool(host)
    # dnf5 (found as /usr/bin/dnf5 under the root) ends each package of its --queryformat only when told to.
    query_format = "%{name}\t%{evr}\n" if dnf5 else "%{name}\t%{evr}"
    # The guarded names, then the globs (the distributions' own ROCm packages among them: agent/defaults.py).
    runner.add(tool.argv("-q", "repoquery", "--qf", query_format, "amdgpu-dkms", "amdgpu-dkms-firmware",
                         "amdrocm-base", "hipcc", "hipify-clang", "kernel", "kernel-core", "kernel-default",
                         "kernel-uek", "rocm-core", "amd-smi*", "amdgpu*", "amdrocm*", "amdrocm-base[0-9]*", "hip-*",
                         "hsa-*", "hsakmt*", "kernel-modules*", "libamd-comgr*", "libamdhip64*", "libhipblas*",
                         "libhipcub*", "libhipfft*", "libhiprand*", "libhipsolver*", "libhipsparse*",
                         "libhsa-runtime64*", "libhsakmt*", "libmiopen*", "librccl*", "librocalution*",
                         "librocblas*", "librocfft*", "librocm-core*", "librocm-smi*", "librocprim*", "librocrand*",
                         "librocsolver*", "librocsparse*", "libroctracer*", "libroctx64*", "linux-image-*",
                         "linux-modules-*", "rocm*", "rocm-core[0-9]*"),
               stdout="".join(f"{n}\t{v}\n" for n, vs in AVAILABLE.items() for v in vs))
    return root, host, tool


def test_apply_dnf4_writes_the_plugins_locklist_and_reports_stale_entries(tmp_path: Path) -> None:
    """The list named by locklist= gets gpuguard's block; a dry run writes nothing; a second run changes nothing."""
    root, host, tool = _host(tmp_path, dnf5=False)
    (root / "etc/dnf/plugins/versionlock.conf").write_text("[main]\nenabled = 1\nlocklist = /etc/dnf/my.list\n")
    (root / "etc/dnf/my.list").write_text(f"bash-0:5.1.8-6.el9.*\n{BEGIN}\n!stale-0:1-1.*\n{END}\n")
    dry = apply_versionlock(host, _policy(tmp_path), tool, INSTALLED, dry_run=True)
    assert dry.changed and (root / "etc/dnf/my.list").read_text().count("stale") == 1
    changes = apply_versionlock(host, _policy(tmp_path), tool, INSTALLED)
    assert changes.path == "/etc/dnf/my.list" and changes.removed == ["!stale-0:1-1.*"] and changes.note is None
    assert changes.added == [f"rocm-core-0:{R62}.*", f"!amdgpu-dkms-{D63}.*", "!kernel-core-0:5.14.0-570.el9.*"]
    text = (root / "etc/dnf/my.list").read_text()
    assert text.startswith("bash-0:5.1.8-6.el9.*\n") and text == changes.text
    again = apply_versionlock(host, _policy(tmp_path), tool, INSTALLED)
    assert not again.changed and again.unchanged == 3 and not again.added


def test_apply_without_the_plugin_config_writes_the_default_list_and_says_so(tmp_path: Path) -> None:
    """Without the versionlock plugin's config, pin apply writes the default list and says which package reads it."""
    root, host, tool = _host(tmp_path, dnf5=False)
    changes = apply_versionlock(host, _policy(tmp_path), tool, INSTALLED)
    assert changes.path == "/etc/dnf/plugins/versionlock.list" and "python3-dnf-plugin-versionlock" in changes.note
    assert (root / "etc/dnf/plugins/versionlock.list").is_file()


def test_apply_dnf5_writes_versionlock_toml(tmp_path: Path) -> None:
    """On dnf5 pin apply rewrites versionlock.toml, keeping the operator's entries and replacing gpuguard's old ones."""
    root, host, tool = _host(tmp_path, dnf5=True)
    (root / "etc/dnf/versionlock.toml").write_text(DNF5_EXISTING)
    changes = apply_versionlock(host, _policy(tmp_path), tool, INSTALLED)
    assert changes.path == "/etc/dnf/versionlock.toml"
    assert changes.removed == ["old: evr != 1-1"] and "rocm-core: evr = 6.2.2.60202-116.el9" in changes.added
    doc = tomllib.loads((root / "etc/dnf/versionlock.toml").read_text())
    assert [p["name"] for p in doc["packages"]] == ["bash", "rocm-core", "amdgpu-dkms", "kernel-core"]


def test_the_rocm_packages_of_a_forbidden_rocm_build_are_excluded_with_it(tmp_path: Path) -> None:
    """rocm-hip-runtime 6.3 requires rocm-core 6.3 at exactly its build: excluded with it (dnf upgrade with
    best=True exits 1 otherwise); the 6.2 builds and packages of other numbering stay."""
    available = {**AVAILABLE, "rocm-hip-runtime": [R62, R63], "hip-runtime-amd": ["6.3.42131.60300-39.el9"],
                 "rocm-core6.3.0": [R63], "rocm-smi-lib": ["7.4.0.60400-1.el9"]}
    policy = tmp_path / "two.toml"
    policy.write_text(POLICY.replace("[frozen]", "[[amd.pairing]]\nname = \"6.3\"\namdgpu = \"6.3.*\"\n"
                                                 "rocm = \"6.3.*\"\n[frozen]"))
    _, forbidden = pin_records(compiled_from(load_policy(str(policy))), {**INSTALLED, "rocm-hip-runtime": R62},
                               available, manager="rpm", context=None)
    pins = {(p.package, p.version): p.why for p in forbidden}
    assert pins[("rocm-hip-runtime", R63)].startswith(f"goes with rocm-core {R63}: ") and "amd.pairing: " in \
        pins[("rocm-hip-runtime", R63)]
    assert ("hip-runtime-amd", "6.3.42131.60300-39.el9") in pins and ("rocm-core6.3.0", R63) in pins
    assert ("rocm-hip-runtime", R62) not in pins and ("rocm-smi-lib", "7.4.0.60400-1.el9") not in pins


THEROCK_POLICY = """
[policy]
name = "rock"
[[amd.pairing]]
name = "7.14"
amdgpu = "any"
rocm = "7.14.*"
"""


@pytest.mark.parametrize("manager, v714, v10", [("dpkg", "7.14.0-1", "10.0.0-4"),
                                                ("rpm", "7.14.0-1.el9", "10.0.0-1.el9")])
def test_a_forbidden_therock_release_is_kept_out_as_a_whole_family(tmp_path: Path, manager: str, v714: str,
                                                                   v10: str) -> None:
    """On a 7.14 host pinned to 7.14, every package of the 10.0 build is forbidden on apt and dnf alike: the
    generic amdrocm meta, the per-target metas of both published forms and the versioned release packages."""
    path = tmp_path / "p.toml"
    path.write_text(THEROCK_POLICY)
    policy = compiled_from(load_policy(str(path)))
    family = ("amdrocm", "amdrocm-core", "amdrocm-core-sdk", "amdrocm-base", "amdrocm-gfx94x")
    installed = {**{n: v714 for n in family}, "amdrocm-base7.14": v714, "amdrocm-core7.14": v714}
    available = {**{n: [v714, v10] for n in family}, "amdrocm-base10.0": [v10], "amdrocm-core10.0": [v10],
                 "amdrocm10.0-gfx1201": [v10], "amdrocm-core-sdk10.0-gfx1151": [v10]}
    _, forbidden = pin_records(policy, installed, available, manager=manager, context=None)
    assert sorted(p.package for p in forbidden if p.version == v10) == sorted(
        [*family, "amdrocm-base10.0", "amdrocm-core10.0", "amdrocm10.0-gfx1201", "amdrocm-core-sdk10.0-gfx1151"])
    assert not [p for p in forbidden if p.version == v714]
