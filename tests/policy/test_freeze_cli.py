"""``gpuguard policy freeze`` on the fixture roots: the written policy passes ``policy check`` and the host is
compliant under it (``policy explain``); an installed driver that is not the loaded one is refused."""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import List, Tuple

import pytest

from agent.cli import main
from tests import needs
from tests.conftest import ROOTS

CONFIG = ["--config", "/nonexistent/agent.toml"]


def _cli(*argv: str) -> Tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def _freeze(root: Path, *options: str) -> Tuple[int, str]:
    return _cli("policy", "freeze", "--root", str(root), *CONFIG, *options)


def _check_and_explain(root: Path, policy: Path) -> List[str]:
    code, out = _cli("policy", "check", str(policy))
    assert code == 0 and ": ok: policy 'freeze-" in out, out
    code, out = _cli("policy", "explain", "--root", str(root), *CONFIG, "--policy", str(policy))
    assert code == 0, out
    return out.splitlines()


@pytest.mark.parametrize(("scenario", "pins"), [
    ("mi300x-rocm62-ubuntu2204", ['amdgpu_package = "1:6.8.5.60202-2041575.22.04"', 'rocm = "6.2.2"',
                                  '  "6.5.0-41-generic",  # running, installed']),
    ("nvidia-h200-ubuntu2404", ['driver = "580.159.04"', 'cuda = ["13.0.2", "13.0.96"]',
                                '  "nvidia-driver-580-open",  # installed 580.159.04-0ubuntu0.24.04.1']),
    ("gpuless-debian12", ["# No GPU driver was found", '  "6.1.0-27-amd64",  # installed']),
    ("therock-mi300x-ubuntu2204", ['rocm = "10.0.0"  # ROCm release (amdrocm-base10.0 10.0.0-4)',
                                   'amdgpu = "30.30.0"', '  "amdrocm-core-sdk10.0",  # installed 10.0.0-4']),
    ("mixed-rocm641-therock713-ubuntu2204", ['rocm = ["6.4.1", "7.13.0"]', "side_by_side = true",
                                             '  "amdrocm-runtime7.13",  # installed 7.13.0-1',
                                             '  "hip-runtime-amd",  # installed 6.4.43482.60401-83~22.04']),
    ("debian13-rocm-cuda", ["ROCm as the distribution packages it (hipcc 5.7.1-6+deb13u1", 'cuda = "12.4.1"',
                            '  "libamdhip64-5",  # installed 5.7.1-6+deb13u1', '  "librocblas0",  # installed',
                            '  "libhsa-runtime64-1",  # installed', '  "libhsakmt1",  # installed',
                            '  "libamd-comgr2",  # installed', '  "hipcc",  # installed',
                            '  "libcublas12",  # installed 12.4.5.8~12.4.1-2', '  "libcufft11",  # installed',
                            '  "libnvrtc12",  # installed', '  "libegl-nvidia0",  # installed 550.163.01-2',
                            '  "libgl1-nvidia-glvnd-glx",  # installed', '  "libnvidia-glcore",  # installed']),
    ("rocm7-rhel9", ["# The loaded amdgpu module 6.14.14 comes from no package",
                     '  "5.14.0-570.12.1.el9_6",  # running, no installed package carries it']),
])
@pytest.mark.parametrize("widened", [False, True], ids=["exact", "widened"])
def test_a_frozen_fixture_host_is_compliant_under_its_policy(tmp_path: Path, scenario: str, pins: List[str],
                                                             widened: bool) -> None:
    """freeze -> policy check exits 0 -> policy explain: compliant; the policy names what it pins."""
    if scenario == "rocm7-rhel9" and shutil.which("rpm") is None:
        needs.unavailable("the rpm fixture root", "rpm is not installed (its database is read with rpm --root)")
    root = _copy_root(tmp_path, scenario)  # rpm --root may create its database under the root it reads
    options = ["--allow-point-releases", "--kernel-series"] if widened else []
    code, text = _freeze(root, *options)
    assert code == 0, text
    if not widened:
        for pin in pins:
            assert pin in text, pin
    assert all(line.startswith("#") or "  # " in line or line in ("", "]") for line in text.splitlines()), text
    policy = tmp_path / "50-freeze.toml"
    policy.write_text(text)
    assert _check_and_explain(root, policy)[-1] == "current state: compliant"


def test_output_is_written_atomically_and_an_existing_file_needs_force(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """--output writes the same text as stdout; an existing file is left alone (exit 2) unless --force."""
    root = ROOTS / "mi300x-rocm62-ubuntu2204"
    _, printed = _freeze(root)
    target = tmp_path / "policy.d" / "50-freeze.toml"
    code, out = _freeze(root, "--output", str(target))
    assert code == 0 and out.startswith(f"wrote {target}; next: gpuguard policy check {target}")
    assert target.read_text() == printed
    target.write_text("# mine\n")
    code, out = _freeze(root, "--output", str(target))
    assert code == 2 and out == "" and target.read_text() == "# mine\n"
    assert capsys.readouterr().err == f"gpuguard: error: {target} exists; pass --force to replace it\n"
    code, _ = _freeze(root, "--output", str(target), "--force", "--name", "site-freeze")
    assert code == 0 and 'name = "site-freeze"  # shown in every refusal' in target.read_text()


def _copy_root(tmp_path: Path, scenario: str) -> Path:
    root = tmp_path / scenario
    shutil.copytree(ROOTS / scenario, root, symlinks=True)
    return root


@pytest.mark.parametrize(("scenario", "module_file", "loaded", "difference"), [
    ("mi300x-rocm62-ubuntu2204", "sys/module/amdgpu/version", "6.10.5",
     "the loaded amdgpu module is 6.10.5, the installed amdgpu-dkms 1:6.8.5.60202-2041575.22.04 builds 6.8.5"),
    ("nvidia-h200-ubuntu2404", "sys/module/nvidia/version", "580.95.05",
     "the loaded nvidia module is 580.95.05, the installed NVIDIA driver is 580.159.04 (libnvidia-compute-580 "
     "580.159.04-0ubuntu0.24.04.1, nvidia-dkms-580-open 580.159.04-0ubuntu0.24.04.1 and 3 more)"),
])
def test_an_installed_driver_that_is_not_loaded_is_refused_unless_accepted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], scenario: str, module_file: str, loaded: str,
        difference: str) -> None:
    """Exit 10 and one line (what differs, how to proceed); --accept-inconsistent writes it into the policy."""
    root = _copy_root(tmp_path, scenario)
    (root / module_file).write_text(loaded + "\n")
    code, out = _freeze(root)
    assert (code, out) == (10, "")
    assert capsys.readouterr().err == (
        f"gpuguard: refusing to freeze: the installed driver is not the loaded one: {difference}; reboot into the "
        f"installed driver and freeze again, or pass --accept-inconsistent to freeze the installed packages (what "
        f"the next boot loads)\n")
    code, text = _freeze(root, "--accept-inconsistent")
    assert code == 0
    assert f"# INCONSISTENT when frozen (--accept-inconsistent): {difference}; this policy pins the installed " \
           f"packages, which the next boot loads." in text
    policy = tmp_path / "freeze.toml"
    policy.write_text(text)
    # the installed packages are judged (what the next boot loads), not the stale module
    assert _check_and_explain(root, policy)[-1] == "current state: compliant"


def test_the_drifted_amd_fixture_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """amdgpu-drift: amdgpu-dkms 6.10.5 (ROCm 6.3) installed, 6.8.5 still loaded."""
    code, out = _freeze(ROOTS / "amdgpu-drift")
    assert (code, out) == (10, "")
    err = capsys.readouterr().err
    assert err.startswith("gpuguard: refusing to freeze: the installed driver is not the loaded one: the loaded "
                          "amdgpu module is 6.8.5, the installed amdgpu-dkms 1:6.10.5.60300-2084815.24.04 builds "
                          "6.10.5;") and err.count("\n") == 1


def test_an_output_that_cannot_be_written_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A directory, or a path under a regular file: exit 2 and one line, no traceback, nothing written."""
    root = ROOTS / "gpuless-debian12"
    assert _freeze(root, "--output", str(tmp_path), "--force") == (2, "")
    assert capsys.readouterr().err == f"gpuguard: error: {tmp_path} is a directory; give a file name, e.g. " \
                                      f"{tmp_path}/50-freeze.toml\n"
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    assert _freeze(root, "--output", str(blocker / "50-freeze.toml")) == (2, "")
    err = capsys.readouterr().err
    assert err.startswith(f"gpuguard: error: cannot write {blocker}/50-freeze.toml: ") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-dir"]


def test_a_name_with_control_characters_is_frozen_escaped(tmp_path: Path) -> None:
    """``--name`` with NUL and ESC: neither the printed policy nor the written file carries them raw, and the
    file still reads back with the name as given."""
    from agent.tomlreader import toml_module

    name = "site\x00\x1b[2J"
    code, out = _freeze(ROOTS / "mi300x-rocm62-ubuntu2204", "--name", name)
    assert code == 0, out
    assert "\x00" not in out and "\x1b" not in out and "policy 'site\\x00\\x1b[2J'" in out
    target = tmp_path / "50-freeze.toml"
    code, _ = _freeze(ROOTS / "mi300x-rocm62-ubuntu2204", "--name", name, "--output", str(target))
    text = target.read_text()
    assert code == 0 and "\x00" not in text and "\x1b" not in text
    assert toml_module().loads(text)["policy"]["name"] == name
