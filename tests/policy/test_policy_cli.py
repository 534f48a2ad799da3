"""``gpuguard policy check`` and ``policy explain`` on the command line: lines, warnings, --json, exit codes."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import List, Tuple

import pytest

from agent.cli import main

REPO = Path(__file__).resolve().parents[2]
ROOTS = REPO / "tests/fixtures/roots"
MI300X = ROOTS / "mi300x-rocm62-ubuntu2204"
GOOD = '[policy]\nname = "site"\n[[amd.pairing]]\nname = "rocm-6.2"\namdgpu = "6.2.*"\nrocm = "6.2.*"\n'


def _run(*argv: str) -> Tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def _write(tmp_path: Path, text: str, name: str = "10-site.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_semantic_errors_exit_3_one_line_each(tmp_path: Path) -> None:
    """policy check prints each semantic problem on its own 'file: field: message' line with a fix, a count, and
    exits 3."""
    path = _write(tmp_path, '[kernel]\nallow = "linux-image-6.8.0-45-generic"\n[amd]\ndriver_package = "amdgpu-dkmss"\n'
                            '[[amd.pairing]]\nname = "p"\namdgpu = "6.2.*"\nrocm = "6.2.2.60202"\n')
    code, out = _run("policy", "check", str(path), "--no-host")
    assert code == 3
    assert out.splitlines() == [
        f"{path}: amd -> driver_package: 'amdgpu-dkmss' is not a package gpuguard knows; did you mean 'amdgpu-dkms'?",
        f"{path}: amd -> pairing -> 1 -> rocm: '6.2.2.60202' is a rocm-core package version, not a ROCm release: "
        f"write rocm = \"6.2.2\" (or \"6.2.*\"), or match the whole version with rocm_package",
        f"{path}: kernel -> allow: 'linux-image-6.8.0-45-generic' is a package name, not a kernel release: write "
        f"'6.8.0-45-generic' (as uname -r prints it)",
        "3 problems found",
    ]


def test_strict_types_on_the_cli(tmp_path: Path) -> None:
    """A quoted boolean or number in the policy is an error that says to write it without quotes."""
    path = _write(tmp_path, '[policy]\nrequire_amd_matrix = "yes"\nmax_override_minutes = "240"\n' + GOOD[9:])
    code, out = _run("policy", "check", str(path), "--no-host")
    assert code == 3 and out.splitlines() == [
        f"{path}: policy -> require_amd_matrix: 'yes' is a string: write true or false (no quotes)",
        f"{path}: policy -> max_override_minutes: '240' is a string: write a whole number (no quotes)",
        "2 problems found"]


def test_outside_the_matrix_while_required_is_an_error(tmp_path: Path) -> None:
    """With require_amd_matrix = true, a pairing that admits no combination of AMD's matrix makes policy check exit
    3."""
    path = _write(tmp_path, '[policy]\nrequire_amd_matrix = true\n[[amd.pairing]]\nname = "p"\namdgpu = "6.2.*"\n'
                            'rocm = "7.1.*"\n')
    code, out = _run("policy", "check", str(path), "--no-host", "--matrix",
                     str(REPO / "policies/amd-compat-matrix.toml"))
    assert code == 3
    assert out.splitlines()[0].startswith(f"{path}: amd -> pairing -> 1: 'p' (amdgpu 6.2.* + ROCm 7.1.*) admits no "
                                          f"combination in AMD's compatibility matrix")


def test_warnings_alone_exit_0_and_are_counted(tmp_path: Path) -> None:
    """On the MI300X fixture (kernel 6.5.0-41), an allow list for 6.8 kernels and a missing package are warnings."""
    path = _write(tmp_path, GOOD + '[kernel]\nallow = "6.8.0-4[0-3]-generic"\n[frozen]\npackages = ["amd-smi-lib", '
                                   '"linux-generic-hwe-22.04"]\n')
    code, out = _run("policy", "check", str(path), "--root", str(MI300X))
    assert code == 0
    assert out.splitlines() == [
        f"warning: {path}: kernel -> allow: matches none of this host's kernels (6.5.0-41-generic)",
        f"warning: {path}: frozen -> packages -> 2: 'linux-generic-hwe-22.04' matches no package installed on this "
        f"host",
        f"{path}: ok: policy 'site', 4 rules, action block, fail-safe block-guarded, from 1 file(s), 2 warnings",
    ]
    assert _run("policy", "check", str(path), "--root", str(MI300X), "--no-host")[1].splitlines() == [
        f"{path}: ok: policy 'site', 4 rules, action block, fail-safe block-guarded, from 1 file(s)"]


@pytest.mark.parametrize("root,expected", [
    ("mi300x-rocm62-ubuntu2204", []),
    ("nvidia-h200-ubuntu2404", ["amd -> driver_package: 'amdgpu-dkms' matches no package installed on this host"]),
    ("gpuless-debian12", ["amd -> driver_package: 'amdgpu-dkms' matches no package installed on this host"]),
])
def test_host_warnings_per_fixture(tmp_path: Path, root: str, expected: List[str]) -> None:
    """Checked against a fixture host, a driver package not installed there is a warning and the exit stays 0."""
    path = _write(tmp_path, '[amd]\ndriver_package = "amdgpu-dkms"\n' + GOOD[GOOD.index("[[amd"):])
    code, out = _run("policy", "check", str(path), "--root", str(ROOTS / root))
    assert code == 0
    assert [line.split(": ", 2)[2] for line in out.splitlines() if line.startswith("warning: ")] == expected


def test_a_host_without_a_package_database_is_one_warning(tmp_path: Path) -> None:
    """A root with no package database gives one warning saying the host checks were skipped, and exit 0."""
    path = _write(tmp_path, GOOD)
    empty = tmp_path / "root"
    empty.mkdir()
    code, out = _run("policy", "check", str(path), "--root", str(empty))
    assert code == 0
    assert out.splitlines()[0] == (f"warning: {empty}: the host's packages could not be read ({empty}/var/lib/dpkg/"
                                   f"status: no dpkg status database); the checks against this host were skipped "
                                   f"(--no-host skips them on purpose)")


def test_check_json(tmp_path: Path) -> None:
    """policy check --json gives errors and warnings with file, field and message, the exit code and the policy's
    name."""
    path = _write(tmp_path, GOOD + '[kernel]\nallow = "linux-image-6.8.0-45-generic"\n')
    code, out = _run("policy", "check", str(path), "--root", str(MI300X), "--json")
    data = json.loads(out)
    assert code == 3 and data["ok"] is False and data["exit_code"] == 3 and data["path"] == str(path)
    assert data["errors"] == [{"severity": "error", "file": str(path), "field": "kernel -> allow",
                               "message": "'linux-image-6.8.0-45-generic' is a package name, not a kernel release: "
                                          "write '6.8.0-45-generic' (as uname -r prints it)"}]
    assert data["warnings"] == [{"severity": "warning", "file": str(path), "field": "kernel -> allow",
                                 "message": "matches none of this host's kernels (6.5.0-41-generic)"}]
    assert data["policy"]["name"] == "site" and data["policy"]["host_checked"] is True


def test_check_json_on_a_structural_error_names_file_and_field(tmp_path: Path) -> None:
    """A structural error in --json output names the file and the field, and the policy is null."""
    (tmp_path / "10-site.toml").write_text('[policy]\naction = "explode"\n')
    code, out = _run("policy", "check", str(tmp_path), "--json", "--no-host")
    data = json.loads(out)
    assert code == 3 and data["policy"] is None
    assert data["errors"] == [{"severity": "error", "file": str(tmp_path / "10-site.toml"), "field": "policy -> action",
                               "message": "Input should be 'warn', 'block' or 'rollback'"}]


def test_check_defaults_to_etc_gpuguard_policy_d_under_root(tmp_path: Path) -> None:
    """Without a path policy check reads <root>/etc/gpuguard/policy.d: missing, empty and holding a policy each say
    so."""
    code, out = _run("policy", "check", "--root", str(tmp_path), "--no-host")
    assert code == 3
    assert out.splitlines() == [f"{tmp_path}/etc/gpuguard/policy.d: no such file or directory", "1 problem found"]
    policy_d = tmp_path / "etc/gpuguard/policy.d"
    policy_d.mkdir(parents=True)
    code, out = _run("policy", "check", "--root", str(tmp_path), "--no-host")
    assert out.splitlines()[0] == (f"{policy_d}: no policy files (*.toml) in this directory: nothing is pinned; add "
                                   f"one (see /etc/gpuguard/example-policy.toml)")
    _write(policy_d, GOOD)
    code, out = _run("policy", "check", "--root", str(tmp_path), "--no-host")
    assert code == 0 and out.startswith(f"{policy_d}: ok: policy 'site'")


def _explain(tmp_path: Path, policy: str, *extra: str) -> Tuple[int, str]:
    path = _write(tmp_path, policy)
    return _run("policy", "explain", "--root", str(MI300X), "--policy", str(path), "--config",
                str(tmp_path / "none.toml"), *extra)


def test_explain_exits_0_when_compliant(tmp_path: Path) -> None:
    """policy explain on a host the policy admits ends with 'current state: compliant' and exits 0."""
    code, out = _explain(tmp_path, GOOD)
    assert code == 0 and out.splitlines()[-1] == "current state: compliant"


def test_explain_exits_10_when_the_host_violates_the_policy(tmp_path: Path) -> None:
    """policy explain on a host the policy refuses lists the violation with the pairings allowed and exits 10."""
    code, out = _explain(tmp_path, GOOD.replace("6.2.*", "6.3.*"))
    assert code == 10
    assert out.splitlines()[-2:] == [
        "current state: 1 violation(s)",
        "  amd.pairing [block]: amdgpu-dkms 1:6.8.5.60202-2041575.22.04 (driver 6.2.2) with rocm-core "
        "6.2.2.60202-116~22.04 (ROCm 6.2.2) matches no allowed AMD pairing (allowed: 'rocm-6.2' (amdgpu 6.3.* + "
        "ROCm 6.3.*))"]


def test_explain_json(tmp_path: Path) -> None:
    """policy explain --json gives compliance, the installed versions, each violation and the exit code, both ways."""
    code, out = _explain(tmp_path, GOOD.replace("6.2.*", "6.3.*"), "--json")
    data = json.loads(out)
    assert code == 10 and data["exit_code"] == 10 and data["compliant"] is False
    assert data["policy"] == "site" and data["manager"] == "dpkg" and data["os_id"] == "ubuntu"
    assert data["installed"]["amdgpu-dkms"] == "1:6.8.5.60202-2041575.22.04"
    assert [(v["rule"], v["action"], v["pairing"]) for v in data["violations"]] == [("amd.pairing", "block", None)]
    assert data["lines"][-2] == "current state: 1 violation(s)"
    code, out = _explain(tmp_path, GOOD, "--json")
    assert code == 0 and json.loads(out)["compliant"] is True and json.loads(out)["violations"] == []


def test_explain_invalid_policy_is_exit_3(tmp_path: Path) -> None:
    """policy explain with an invalid policy exits 3."""
    out = io.StringIO()
    path = _write(tmp_path, '[policy]\nrequire_amd_matrix = "yes"\n')
    code = main(["policy", "explain", "--root", str(MI300X), "--policy", str(path), "--config",
                 str(tmp_path / "none.toml")], out=out)
    assert code == 3


def test_help_documents_the_exit_codes_and_defaults() -> None:
    """The help of policy check and policy explain names their default directory and their options."""
    from agent.cli import build_parser

    assert "policy" in build_parser().format_help()
    for argv, needles in ((["policy", "check", "--help"], ["/etc/gpuguard/policy.d", "--json", "--no-host",
                                                           "warning"]),
                          (["policy", "explain", "--help"], ["--json"])):
        out = io.StringIO()
        with pytest.raises(SystemExit), contextlib.redirect_stdout(out):
            main(argv, out=out)
        for needle in needles:
            assert needle in out.getvalue()


def test_fixture_root_is_a_host() -> None:
    """The fixture this file leans on is a dpkg host with AMD's stack (guards against a moved fixture)."""
    assert "Package: amdgpu-dkms" in (MI300X / "var/lib/dpkg/status").read_text()


# A policy whose every printed value carries a NUL and an ESC (TOML writes them as \u escapes).
HOSTILE = ('[policy]\nname = "evil\\u0000x\\u001b[31mred"\n[[amd.pairing]]\nname = "p\\u0000\\u001b[2J"\n'
           'amdgpu = "6.2.*"\nrocm = "6.2.*"\n[[versions]]\nname = "v\\u001b]52;c;\\u0007"\n'
           'packages = ["nvidia-container-toolkit\\u001b"]\nallow = ">= 1.0"\naction = "warn"\n')


def _controls(text: str) -> List[str]:
    """The control characters in ``text`` other than the newlines that end its lines."""
    return [hex(ord(c)) for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0]


@pytest.mark.parametrize("argv", [("policy", "check", "--no-host"), ("policy", "check", "--root", str(MI300X)),
                                  ("policy", "explain", "--root", str(MI300X), "--config", "/nonexistent/agent.toml",
                                   "--policy")])
def test_nul_and_escape_in_policy_values_are_printed_escaped(tmp_path: Path, argv: Tuple[str, ...]) -> None:
    """A policy name, pairing name, rule name and package pattern with NUL, ESC and BEL reach the terminal as
    visible escapes (``\\x00``, ``\\x1b``), never raw (policy check printed the name's NUL as is)."""
    path = _write(tmp_path, HOSTILE)
    code, out = _run(*argv, str(path))
    assert code == 0, out
    assert _controls(out) == [], out
    assert "policy 'evil\\x00x\\x1b[31mred'" in out
    if argv[1] == "explain":
        assert "'p\\x00\\x1b[2J'" in out and "versions 'v\\x1b]52;c;\\x07'" in out
