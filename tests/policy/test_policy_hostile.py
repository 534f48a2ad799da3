"""``gpuguard policy check`` and ``policy compile`` on hostile files: a FIFO never hangs them, an oversized file is
refused unread, 100,000 guarded names are checked against a host in seconds, and the matrix's types are strict:
every refusal one line naming file and field."""

from __future__ import annotations

import io
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Tuple

import pytest

from agent.cli import main
from agent.policy import load as policy_load
from tests.conftest import fill_disk

REPO = Path(__file__).resolve().parents[2]
MATRIX = REPO / "policies/amd-compat-matrix.toml"
GOOD = '[policy]\nname = "site"\n[[amd.pairing]]\nname = "rocm-6.2"\namdgpu = "6.2.*"\nrocm = "6.2.*"\n'


def _cli(*argv: str, timeout_seconds: float = 120) -> Tuple[int, str, float]:
    """``python -m agent ARGV`` in a child (a hang on main must end at the timeout, not hang the suite): exit code,
    output, and the CPU seconds the child used, which, unlike its wall time, a loaded machine does not stretch."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([sys.executable, "-m", "agent", *argv], capture_output=True, text=True,
                            timeout=timeout_seconds, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return result.returncode, result.stdout + result.stderr, cpu_seconds


@pytest.mark.parametrize("command", ["check", "compile"])
def test_a_fifo_as_the_policy_is_refused_in_one_line(tmp_path: Path, command: str) -> None:
    """A FIFO in place of the policy file: exit 3 at once with 'not a regular file', never a wait for a writer."""
    fifo = tmp_path / "policy.toml"
    os.mkfifo(fifo)
    argv = ["policy", "check", "--no-host", str(fifo)] if command == "check" else [
        "policy", "compile", "--policy", str(fifo), "-o", str(tmp_path / "compiled.json")]
    code, out, _ = _cli(*argv)  # a wait for a writer would never end: _cli's timeout fails it
    assert code == 3, out
    assert f"{fifo}: not a regular file" in out.splitlines()[0] and "Traceback" not in out
    assert not (tmp_path / "compiled.json").exists()


def test_a_fifo_as_the_matrix_is_refused_in_one_line(tmp_path: Path) -> None:
    """A FIFO given as --matrix to a policy that requires the matrix: exit 3 at once, file and reason named."""
    fifo = tmp_path / "matrix.toml"
    os.mkfifo(fifo)
    policy = tmp_path / "policy.toml"
    policy.write_text('[policy]\nname = "m"\nrequire_amd_matrix = true\n')
    code, out, _ = _cli("policy", "check", "--no-host", "--matrix", str(fifo), str(policy))  # no wait: see above
    assert code == 3, out
    assert out.splitlines()[0] == f"{fifo}: not a regular file"



@pytest.mark.parametrize("links", [{"20-self.toml": "20-self.toml"},
                                   {"20-a.toml": "30-b.toml", "30-b.toml": "20-a.toml"}])
@pytest.mark.parametrize("command", ["check", "compile"])
def test_a_symlink_loop_in_policy_d_is_an_error_naming_it(tmp_path: Path, links: dict, command: str) -> None:
    """A self-looping link, or a loop through two links, in policy.d is exit 3 with a line naming each link (it
    was skipped without a word and the rest of the directory passed)."""
    policy_d = tmp_path / "policy.d"
    policy_d.mkdir()
    (policy_d / "10-site.toml").write_text(GOOD)
    for name, target in links.items():
        (policy_d / name).symlink_to(target)
    argv = ["policy", "check", "--no-host", str(policy_d)] if command == "check" else [
        "policy", "compile", "--policy", str(policy_d), "-o", str(tmp_path / "compiled.json")]
    code, out, _ = _cli(*argv, timeout_seconds=30)
    loop = "a symbolic link loop (Too many levels of symbolic links): fix or remove it"
    assert code == 3, out
    if command == "check":  # policy check: one line per problem, then the count
        count = f"{len(links)} problem{'s' if len(links) > 1 else ''} found"
        assert out.splitlines() == [f"{policy_d}/{name}: {loop}" for name in sorted(links)] + [count]
    else:
        assert out.splitlines() == ["gpuguard: error: " + "; ".join(f"{policy_d}: {name}: {loop}"
                                                                    for name in sorted(links))]
        assert not (tmp_path / "compiled.json").exists()


def test_a_symlink_to_nothing_in_policy_d_is_an_error_naming_it(tmp_path: Path) -> None:
    """A dangling link named *.toml in policy.d is exit 3 naming it, not a file quietly left out."""
    policy_d = tmp_path / "policy.d"
    policy_d.mkdir()
    (policy_d / "10-site.toml").write_text(GOOD)
    (policy_d / "20-gone.toml").symlink_to(tmp_path / "gone.toml")
    out = io.StringIO()
    code = main(["policy", "check", "--no-host", str(policy_d)], out=out)
    assert code == 3
    assert out.getvalue().splitlines() == [f"{policy_d}/20-gone.toml: a symbolic link to nothing (No such file or "
                                           f"directory): fix or remove it", "1 problem found"]

def test_an_oversized_policy_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy file over MAX_TOML_BYTES is one line naming the file and the cap (exit 3)."""
    monkeypatch.setattr(policy_load, "MAX_TOML_BYTES", 100)
    path = tmp_path / "policy.toml"
    path.write_text(GOOD + "#" * 200 + "\n")
    out = io.StringIO()
    code = main(["policy", "check", "--no-host", str(path)], out=out)
    assert code == 3 and out.getvalue().splitlines()[0] == f"{path}: larger than 100 bytes"


@pytest.mark.timeout(600)  # the wall time a loaded machine may take; the CPU bound is the assertion
def test_100000_guarded_names_are_checked_against_a_host_in_seconds(tmp_path: Path) -> None:
    """policy check over a host of 3,000 packages and a policy guarding 100,000 names: well within 30 CPU seconds
    (main matched every name against every pattern: minutes)."""
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text("".join(
        f"Package: lib{i}-x\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1.{i}\n\n"
        for i in range(3000)))
    (tmp_path / "etc/gpuguard/policy.d").mkdir(parents=True)
    names = ", ".join(f'"pkg-{i}"' for i in range(100000))
    (tmp_path / "etc/gpuguard/policy.d/10-big.toml").write_text(
        f'[policy]\nname = "big"\nguarded = [{names}, "lib7-*", "*-x", "lib1[0-9]-x"]\n[kernel]\nallow = "6.1.*"\n')
    code, out, cpu_seconds = _cli("policy", "check", "--root", str(tmp_path), timeout_seconds=600)
    assert code == 0 and cpu_seconds < 30, (cpu_seconds, out[-2000:])
    lines = out.splitlines()
    assert len([ln for ln in lines if "matches no package installed on this host" in ln]) == 100000
    assert not [ln for ln in lines if "'lib7-*'" in ln or "'*-x'" in ln or "'lib1[0-9]-x'" in ln]


@pytest.mark.parametrize("line,value,fragment", [
    ("format = 2", 'format = "1"', "format: '1' is a string: write a whole number (no quotes)"),
    ("format = 2", "format = 1.0", "format: 1.0 is not a whole number"),
    ("format = 2", "format = true", "format: true is a boolean: write a whole number"),
])
def test_wrong_types_in_the_matrix_are_one_line_each(tmp_path: Path, line: str, value: str, fragment: str) -> None:
    """The matrix is strict like the policy: no string, float or boolean for a number; one line naming the file and
    the field (exit 3)."""
    matrix = tmp_path / "matrix.toml"
    text = MATRIX.read_text()
    assert f"\n{line}\n" in text
    matrix.write_text(text.replace(f"\n{line}\n", f"\n{value}\n", 1))
    policy = tmp_path / "policy.toml"
    policy.write_text('[policy]\nname = "m"\nrequire_amd_matrix = true\n')
    out = io.StringIO()
    code = main(["policy", "check", "--no-host", "--matrix", str(matrix), str(policy)], out=out)
    lines = out.getvalue().splitlines()
    assert code == 3 and lines[0].startswith(f"{matrix}: {fragment}") and lines[1:] == ["1 problem found"], lines


def test_compile_on_a_full_disk_is_exit_16_and_keeps_the_compiled_policy(tmp_path: Path, small_disk: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """ENOSPC while the compiled policy is written: one line, exit 16, the hook's old compiled policy intact."""
    policy = tmp_path / "policy.toml"
    policy.write_text(GOOD)
    target = small_disk / "policy.compiled.json"
    target.write_text('{"old": true}\n')
    fill_disk(small_disk / "filler")
    code = main(["policy", "compile", "--policy", str(policy), "-o", str(target)], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 16 and err.splitlines() == [
        f"gpuguard: error: {target}: cannot be written (No space left on device): the old file is kept"]
    assert target.read_text() == '{"old": true}\n'
