"""Semantic checks: policies that parse but can never match or block everything, each with its exact message."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import pytest

from agent.errors import PolicyError
from agent.policy.load import load_policy
from agent.policy.matrix import Matrix, load_matrix
from agent.policy.semantic import WARNING, Inventory, Problem, check_policy, inventory_kernels

REPO = Path(__file__).resolve().parents[2]
MATRIX = load_matrix(str(REPO / "policies/amd-compat-matrix.toml"))
PAIR = '[[amd.pairing]]\nname = "p"\n'


def _check(tmp_path: Path, text: str, matrix: Optional[Matrix] = MATRIX,
           inventory: Optional[Inventory] = None) -> List[Problem]:
    path = tmp_path / "10-site.toml"
    path.write_text(text)
    loaded = load_policy(str(path))
    problems = check_policy(loaded.parts, loaded.policy, matrix, inventory)
    assert all(p.file == str(path) for p in problems)
    return problems


ERRORS = [
    # a kernel package name where a kernel release belongs
    ('[kernel]\nallow = "linux-image-6.8.0-45-generic"\n',
     "kernel -> allow: 'linux-image-6.8.0-45-generic' is a package name, not a kernel release: write "
     "'6.8.0-45-generic' (as uname -r prints it)"),
    ('[kernel]\nallow = ["5.15.0-*-generic", "linux-image-6.8.0-4*-generic"]\n',
     "kernel -> allow -> 2: 'linux-image-6.8.0-4*-generic' is a package name, not a kernel release: write "
     "'6.8.0-4*-generic' (as uname -r prints it)"),
    ('[kernel]\nallow = "kernel-core-5.14.0-427.el9.x86_64"\n',
     "kernel -> allow: 'kernel-core-5.14.0-427.el9.x86_64' is a package name, not a kernel release: write "
     "'5.14.0-427.el9.x86_64' (as uname -r prints it)"),
    ('[kernel]\nallow = "linux-generic-hwe-22.04"\n',
     "kernel -> allow: 'linux-generic-hwe-22.04' is a package name, not a kernel release (uname -r, such as "
     "'6.8.0-45-generic'); to hold a package, list it in [frozen] packages"),
    ('[kernel]\nallow = "6.8.0-45.45"\n',
     "kernel -> allow: '6.8.0-45.45' is a kernel package version, not a kernel release (uname -r, such as "
     "'6.8.0-45-generic')"),
    ('[amd]\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = "6.2.*"\n'
     'kernels = [">= 6.8.0-40-generic", "linux-image-6.8.0-41-generic"]\n',
     "amd -> pairing -> 1 -> kernels -> 2: 'linux-image-6.8.0-41-generic' is a package name, not a kernel release: "
     "write '6.8.0-41-generic' (as uname -r prints it)"),
    # package versions where releases belong
    ('[amd]\n' + PAIR + 'amdgpu = "1:6.8.5.60202-2041575.22.04"\nrocm = "6.2.*"\n',
     "amd -> pairing -> 1 -> amdgpu: '1:6.8.5.60202-2041575.22.04' is an amdgpu-dkms package version, not a driver "
     "release: write amdgpu = \"6.2.2\" (or \"6.2.*\"), or match the whole version with amdgpu_package"),
    ('[amd]\n' + PAIR + 'amdgpu = "1:6.16.6.30200000-2238411.24.04"\nrocm = "7.1.*"\n',
     "amd -> pairing -> 1 -> amdgpu: '1:6.16.6.30200000-2238411.24.04' is an amdgpu-dkms package version, not a "
     "driver release: write amdgpu = \"30.20.0\" (or \"30.20.*\"), or match the whole version with amdgpu_package"),
    ('[amd]\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = "6.2.2.60202"\n',
     "amd -> pairing -> 1 -> rocm: '6.2.2.60202' is a rocm-core package version, not a ROCm release: write rocm = "
     "\"6.2.2\" (or \"6.2.*\"), or match the whole version with rocm_package"),
    ('[amd]\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = ">= 6.2.0.60200-1, << 6.3"\n',
     "amd -> pairing -> 1 -> rocm: '6.2.0.60200-1' is a rocm-core package version, not a ROCm release: write rocm "
     "= \"6.2.0\" (or \"6.2.*\"), or match the whole version with rocm_package"),
    ('[amd]\n' + PAIR + 'amdgpu = "amdgpu-dkms"\nrocm = "6.2.*"\n',
     "amd -> pairing -> 1 -> amdgpu: 'amdgpu-dkms' is a package name, not a driver release (such as '6.2.2')"),
    ('[[nvidia.pairing]]\nname = "n"\ndriver = "580.95.05-0ubuntu0.24.04.2"\ncuda = "13.0.*"\n',
     "nvidia -> pairing -> 1 -> driver: '580.95.05-0ubuntu0.24.04.2' is a package version, not an NVIDIA driver "
     "release: write driver = \"580.95.05\" (or \"580.*\")"),
    ('[[nvidia.pairing]]\nname = "n"\ndriver = "580.*"\ncuda = "cuda-toolkit-13-0"\n',
     "nvidia -> pairing -> 1 -> cuda: 'cuda-toolkit-13-0' is a package name, not a CUDA release (such as "
     "'13.0.96')"),
    # exact releases too short to equal any real one
    ('[amd]\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = "6.2"\n',
     "amd -> pairing -> 1 -> rocm: '6.2' equals no ROCm release: releases read from the packages have 3 parts "
     "(6.2.2); write \"6.2.*\" or a range (\">= 6.2, << ...\")"),
    ('[[nvidia.pairing]]\nname = "n"\ndriver = "580"\ncuda = "13.0.*"\n',
     "nvidia -> pairing -> 1 -> driver: '580' equals no NVIDIA driver release: releases read from the packages "
     "have 2 parts (580.95.05); write \"580.*\" or a range (\">= 580, << ...\")"),
    ('[[nvidia.pairing]]\nname = "n"\ndriver = "580.*"\ncuda = "13.0"\n',
     "nvidia -> pairing -> 1 -> cuda: '13.0' equals no CUDA release: releases read from the packages have 3 parts "
     "(13.0.96); write \"13.0.*\" or a range (\">= 13.0, << ...\")"),
    # the DKMS base is not a driver release
    ('[amd]\n' + PAIR + 'amdgpu = "6.8.5"\nrocm = "6.2.*"\n',
     "amd -> pairing -> 1 -> amdgpu: '6.8.5' is the DKMS kernel-driver base of amdgpu driver 6.2.x (amdgpu-dkms "
     "1:6.8.5.60202-2041575.22.04), not a driver release: write amdgpu = \"6.2.*\""),
    # releases where whole package versions are compared
    ('[amd]\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = "6.2.*"\namdgpu_package = "6.2.*"\n',
     "amd -> pairing -> 1 -> amdgpu_package: '6.2.*' is a driver release, not an amdgpu-dkms package version (such "
     "as 1:6.8.5.60202-2041575.22.04, epoch and build included): put the release in amdgpu, or compare whole "
     "versions (\">= 1:6.8.5.60202\")"),
    ('[amd]\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = "6.2.*"\nrocm_package = "6.2.2"\n',
     "amd -> pairing -> 1 -> rocm_package: '6.2.2' is a ROCm release; rocm-core versions look like "
     "6.2.2.60202-116~22.04, so it equals none: write rocm = \"6.2.2\", or rocm_package = \"6.2.2.*\""),
    ('[amd]\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = "6.2.*"\nrocm_package = "rocm"\n',
     "amd -> pairing -> 1 -> rocm_package: 'rocm' is a package name, not a package version"),
    # package names: misspelt, or versions
    ('[amd]\ndriver_package = "amdgpu-dkmss"\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = "6.2.*"\n',
     "amd -> driver_package: 'amdgpu-dkmss' is not a package gpuguard knows; did you mean 'amdgpu-dkms'?"),
    ('[amd]\nrocm_package = "rocm_core"\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = "6.2.*"\n',
     "amd -> rocm_package: 'rocm_core' is not a package gpuguard knows; did you mean 'rocm-core'?"),
    ('[frozen]\npackages = ["amd-smi-lib", "6.8.0-45-generic"]\n',
     "frozen -> packages -> 2: '6.8.0-45-generic' is a version, not a package name or glob"),
    ('[[versions]]\npackages = ["nvidia-container-toolkit=1.17.3"]\nallow = "any"\n',
     "versions -> 1 -> packages -> 1: 'nvidia-container-toolkit=1.17.3' is a version, not a package name or glob"),
    # outside AMD's matrix while the matrix is required
    ('[policy]\nrequire_amd_matrix = true\n[amd]\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = "7.1.*"\n',
     "amd -> pairing -> 1: 'p' (amdgpu 6.2.* + ROCm 7.1.*) admits no combination in AMD's compatibility matrix "
     "(recorded 2026-12-04), and require_amd_matrix = true refuses everything outside it (driver 6.2.x supports "
     "ROCm 6.0, 6.1, 6.2, 6.3, 6.4, 7.0)"),
    ('[policy]\nrequire_amd_matrix = true\n[amd]\n' + PAIR + 'amdgpu = "31.*"\nrocm = "6.*"\n',
     "amd -> pairing -> 1: 'p' (amdgpu 31.* + ROCm 6.*) admits no combination in AMD's compatibility matrix "
     "(recorded 2026-12-04), and require_amd_matrix = true refuses everything outside it (driver 31.50.x supports "
     "ROCm 7.0, 7.1, 7.2, 7.14, 10.0; driver 31.40.x supports ROCm 7.0, 7.1, 7.2, 7.14, 10.0)"),
    ('[policy]\nrequire_amd_matrix = true\n[amd]\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = "5.1.*"\n',
     "amd -> pairing -> 1: 'p' (amdgpu 6.2.* + ROCm 5.1.*) admits no combination in AMD's compatibility matrix "
     "(recorded 2026-12-04), and require_amd_matrix = true refuses everything outside it (driver 6.2.x supports "
     "ROCm 6.0, 6.1, 6.2, 6.3, 6.4, 7.0)"),
]


@pytest.mark.parametrize("text,message", ERRORS, ids=[m.split(":")[0] + f" #{i}" for i, (_, m) in enumerate(ERRORS)])
def test_wrong_but_parseable_policy_is_one_exact_error(tmp_path: Path, text: str, message: str) -> None:
    """Each wrong-but-parseable policy gets exactly one error, with this message."""
    problems = _check(tmp_path, text)
    assert [(p.severity, p.text()) for p in problems] == [("error", message)]


STRICT = [
    ('[policy]\nrequire_amd_matrix = "yes"\n',
     "policy -> require_amd_matrix: 'yes' is a string: write true or false (no quotes)"),
    ('[policy]\nrequire_amd_matrix = 1\n', "policy -> require_amd_matrix: 1 is a number: write true or false"),
    ('[policy]\nmax_override_minutes = "240"\n',
     "policy -> max_override_minutes: '240' is a string: write a whole number (no quotes)"),
    ('[policy]\nmax_override_minutes = 90.5\n', "policy -> max_override_minutes: 90.5 is not a whole number"),
    ('[policy]\nmax_override_minutes = true\n',
     "policy -> max_override_minutes: true is a boolean: write a whole number"),
    ('[policy]\nname = 5\n', "policy -> name: 5 is a number: write a string in quotes"),
    ('[amd]\nside_by_side = "false"\n',
     "amd -> side_by_side: 'false' is a string: write true or false (no quotes)"),
    ('[nvidia]\nside_by_side = 0\n', "nvidia -> side_by_side: 0 is a number: write true or false"),
]


@pytest.mark.parametrize("text,message", STRICT)
def test_strict_types_no_string_for_a_bool_or_a_number(tmp_path: Path, text: str, message: str) -> None:
    """A string, number or boolean of the wrong TOML type is refused (not coerced) with a message saying so."""
    path = tmp_path / "p.toml"
    path.write_text(text + '[[versions]]\npackages = ["x"]\nallow = "any"\n')
    with pytest.raises(PolicyError) as info:
        load_policy(str(path))
    assert info.value.problems == (message,)


def test_warnings_exact_revision_less_version(tmp_path: Path) -> None:
    """An exact version without a revision is a warning (native packages have none), not an error."""
    problems = _check(tmp_path, '[[versions]]\npackages = ["nvidia-container-toolkit"]\nallow = "1.17.3"\n')
    assert problems == [Problem("versions -> 1 -> allow", "'1.17.3' has no revision: it equals only a version "
                                "without one (not 1.17.3-1); write \"1.17.3-*\" or \">= 1.17.3, << ...\"", WARNING,
                                str(tmp_path / "10-site.toml"))]


def test_unknown_but_not_misspelt_driver_package_is_a_warning(tmp_path: Path) -> None:
    """A driver package gpuguard does not know, and not a misspelling of one, is a warning, not an error."""
    problems = _check(tmp_path, '[amd]\ndriver_package = "site-amdgpu-build"\n' + PAIR
                      + 'amdgpu = "6.2.*"\nrocm = "6.2.*"\n')
    assert [(p.severity, p.text()) for p in problems] == [
        (WARNING, "amd -> driver_package: 'site-amdgpu-build' is not a package gpuguard knows to carry this release "
                  "(amdgpu-dkms, amdgpu): its version must encode the release as AMD's do")]


GOOD = [
    '[kernel]\nallow = ["5.15.0-*-generic", ">= 6.8.0-40-generic, << 6.8.0-44-generic", "5.14.0-427.el9.x86_64"]\n',
    '[amd]\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = ">= 6.2.0, << 6.3"\namdgpu_package = ">= 1:6.8.5.60202"\n'
    'rocm_package = "6.2.2.*"\nkernels = "6.8.0-4[0-3]-generic"\n',
    '[amd]\nrocm_package = "rocm-core6.4.1"\n' + PAIR + 'amdgpu = "none"\nrocm = "6.4.1"\n',
    '[policy]\nrequire_amd_matrix = true\n[amd]\n' + PAIR + 'amdgpu = "30.20.*"\nrocm = "7.1.*"\n',
    '[policy]\nrequire_amd_matrix = true\n[amd]\n' + PAIR + 'amdgpu = "none"\nrocm = "7.1.*"\n',
    '[policy]\nrequire_amd_matrix = true\n[amd]\n' + PAIR + 'amdgpu = "any"\nrocm = "any"\n',
    '[[nvidia.pairing]]\nname = "n"\ndriver = "580.95.05"\ncuda = ["13.0.*", ">= 12.8, << 13"]\n',
    '[[versions]]\npackages = ["nvidia-container-toolkit*"]\nallow = ">= 1.17.3, << 1.18"\n',
    (REPO / "policies/example.toml").read_text(),
]


@pytest.mark.parametrize("text", GOOD)
def test_sound_policies_have_no_problems(tmp_path: Path, text: str) -> None:
    """Sound policies, the shipped example among them, have no problem and no warning."""
    assert _check(tmp_path, text) == []


def test_matrix_checks_only_when_required_and_available(tmp_path: Path) -> None:
    """A pairing outside AMD's matrix is a problem only when the matrix is required and loaded."""
    text = '[amd]\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = "7.1.*"\n'
    assert _check(tmp_path, text) == []
    assert _check(tmp_path, "[policy]\nrequire_amd_matrix = true\n" + text, matrix=None) == []


def test_directory_problems_name_the_file_and_use_the_merged_matrix_switch(tmp_path: Path) -> None:
    """require_amd_matrix in one file makes another file's pairing an error, named by that file."""
    (tmp_path / "10-base.toml").write_text("[policy]\nrequire_amd_matrix = true\n")
    (tmp_path / "20-pairs.toml").write_text('[amd]\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = "7.1.*"\n')
    loaded = load_policy(str(tmp_path))
    problems = check_policy(loaded.parts, loaded.policy, MATRIX)
    assert [(Path(p.file).name, p.where) for p in problems] == [("20-pairs.toml", "amd -> pairing -> 1")]


HOST = Inventory(installed={"amdgpu-dkms": "1:6.8.5.60202-2041575.22.04", "rocm-core": "6.2.2.60202-116~22.04",
                            "linux-image-6.5.0-41-generic": "6.5.0-41.41~22.04.2"},
                 kernels=("6.5.0-41-generic",))


def test_rules_matching_nothing_on_this_host_are_warnings(tmp_path: Path) -> None:
    """Globs, kernel specs and package names that match nothing on the host are each a warning naming the field."""
    text = ('[policy]\nguarded = ["hip-runtime-amd*"]\n[amd]\ndriver_package = "amdgpu-dkms"\n' + PAIR
            + 'amdgpu = "6.2.*"\nrocm = "6.2.*"\nkernels = "6.8.0-4[0-3]-generic"\n'
            '[kernel]\nallow = "5.15.0-*-generic"\n[[versions]]\npackages = ["nvidia-container-toolkt"]\n'
            'allow = "any"\n[frozen]\npackages = ["rocm-core", "linux-generic-hwe-22.04"]\n')
    problems = _check(tmp_path, text, inventory=HOST)
    assert [(p.severity, p.text()) for p in problems] == [
        (WARNING, "policy -> guarded -> 1: 'hip-runtime-amd*' matches no package installed on this host"),
        (WARNING, "amd -> pairing -> 1 -> kernels: matches none of this host's kernels (6.5.0-41-generic)"),
        (WARNING, "kernel -> allow: matches none of this host's kernels (6.5.0-41-generic)"),
        (WARNING, "versions -> 1 -> packages -> 1: 'nvidia-container-toolkt' matches no package installed on this "
                  "host"),
        (WARNING, "frozen -> packages -> 2: 'linux-generic-hwe-22.04' matches no package installed on this host"),
    ]


def test_rules_matching_this_host_have_no_warnings(tmp_path: Path) -> None:
    """Rules that match the host's packages and kernels give no warning."""
    text = ('[amd]\ndriver_package = "amdgpu-dkms"\n' + PAIR + 'amdgpu = "6.2.*"\nrocm = "6.2.*"\n'
            '[kernel]\nallow = "6.5.0-*-generic"\n[frozen]\npackages = ["rocm-*"]\n')
    assert _check(tmp_path, text, inventory=HOST) == []


def test_inventory_kernels_running_first_then_packages() -> None:
    """The host's kernels are the running one first, then those of kernel packages, rpm's without the architecture."""
    installed = {"linux-image-6.8.0-45-generic": "6.8.0-45.45", "linux-modules-6.8.0-45-generic": "6.8.0-45.45",
                 "linux-image-6.8.0-41-generic": "6.8.0-41.41", "rocm-core": "6.2.2.60202-116~22.04"}
    assert inventory_kernels(installed, "dpkg", "6.8.0-45-generic") == ("6.8.0-45-generic", "6.8.0-41-generic")
    rpm = {"kernel-core@5.14.0-427.el9": "5.14.0-427.el9"}
    assert inventory_kernels(rpm, "rpm", None) == ("5.14.0-427.el9",)
    # rpm: the running kernel's uname -r loses its architecture, as policies write it and the evaluator judges it
    assert inventory_kernels(rpm, "rpm", "5.14.0-570.12.1.el9_6.x86_64") == ("5.14.0-570.12.1.el9_6", "5.14.0-427.el9")


def test_a_rocm_release_the_matrix_does_not_know_is_named(tmp_path: Path) -> None:
    """rocm = ["7.13.*", "10.0.*"]: 7.13 (no AMD table) is named in a warning; 10.0 (AMD's driver table) is not."""
    problems = _check(tmp_path, '[amd]\n' + PAIR + 'amdgpu = "30.30.*"\nrocm = ["7.13.*", "10.0.*"]\n')
    assert [(p.severity, p.where) for p in problems] == [(WARNING, "amd -> pairing -> 1 -> rocm -> 1")]
    assert problems[0].message.startswith("ROCm 7.13 is a release AMD's compatibility matrix (recorded ")
    assert "7.2, 7.14, 10.0" in problems[0].message


def test_therock_base_package_is_a_known_rocm_package(tmp_path: Path) -> None:
    """rocm_package = "amdrocm-base" and its versioned form amdrocm-base7.13 are packages gpuguard knows."""
    for name in ("amdrocm-base", "amdrocm-base7.13"):
        assert _check(tmp_path, f'[amd]\nrocm_package = "{name}"\n' + PAIR + 'amdgpu = "any"\nrocm = "any"\n') == []


def test_a_host_on_a_rocm_release_the_matrix_does_not_know_is_warned(tmp_path: Path) -> None:
    """A mixed host with classic 6.4.1 and TheRock 7.13: 7.13 is named with its package; 6.4.1 is known."""
    host = Inventory(installed={"rocm-core": "6.4.1.60401-83~22.04", "amdrocm-base7.13": "7.13.0-1",
                                "amdrocm-base10.0": "10.0.0-4"})
    problems = _check(tmp_path, '[amd]\n' + PAIR + 'amdgpu = "any"\nrocm = "any"\n', inventory=host)
    assert [p.text() for p in problems] == [
        "amd: this host has ROCm 7.13.0 (amdrocm-base7.13 7.13.0-1), a release AMD's compatibility matrix "
        "(recorded 2026-12-04) does not know"]
