"""The zypper guard's rpm plugin hook and commit plugin over a fake root: parsing, plans, verdicts, fail-safe."""

from __future__ import annotations

import datetime as dt
import io
import os
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

from agent.errors import InputFileError
from agent.guard.hotpath import decision as exits
from agent.guard.zypper import commit_plugin, rpm_hook
from agent.guard.zypper import plan as zypper_plan
from agent.policy.load import load_and_compile, write_compiled
from tests.guard.dnf.installroot.harness import TEST_POLICY

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
AMD62 = ("amdgpu-dkms", "1", "6.8.5.60202", "2041575.sles15", "noarch")
AMD63 = ("amdgpu-dkms", "1", "6.10.5.60300", "2084815.sles15", "noarch")
ROCM62 = ("rocm-core", "", "6.2.2.60202", "116.sles15", "x86_64")
ROCM63 = ("rocm-core", "", "6.3.0.60300", "39.sles15", "x86_64")
HELLO, HELLO2 = ("hello-fake", "", "1.0", "1", "noarch"), ("hello-fake", "", "1.1", "1", "noarch")
INSTALLED = [AMD62, ROCM62, HELLO]


def lines(incoming: List[Tuple[str, ...]], outgoing: List[Tuple[str, ...]], parent: int = 1,
          installed: List[Tuple[str, ...]] = INSTALLED, end: bool = True) -> str:
    out = ["root\t/", f"parent\t{parent}"]
    out += ["I\t" + "\t".join(p) for p in installed]
    out += ["+\t" + "\t".join(p) for p in incoming] + ["-\t" + "\t".join(p) for p in outgoing]
    return "\n".join(out + (["end"] if end else [])) + "\n"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    policy = tmp_path / "policy.toml"
    policy.write_text(TEST_POLICY)
    _, compiled = load_and_compile(str(policy))
    write_compiled(str(tmp_path / "var/lib/gpuguard/policy.compiled.json"), compiled)
    return tmp_path


def fake_proc(tmp_path: Path, pid: int, comm: str, ticks: int) -> Path:
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "comm").write_text(comm + "\n")
    fields = ["S"] + ["0"] * 18 + [str(ticks)] + ["0"] * 10
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")
    return proc


def hook(root: Path, text: str, proc: Optional[Path] = None, plan_dir: Optional[Path] = None) -> Tuple[int, str]:
    err = io.StringIO()
    argv = ["--root", str(root), "--plan-dir", str(plan_dir or root / "plans")]
    code = rpm_hook.run(argv, io.BytesIO(text.encode("utf-8", "replace")), err, lambda: NOW,
                        proc=str(proc or root / "noproc"))
    out = err.getvalue()
    assert "Traceback" not in out
    assert all(line.startswith("gpuguard: ") for line in out.splitlines())
    return code, out


def test_parse_reads_every_line_kind() -> None:
    """root, parent, installed and the transaction's elements are read into their fields."""
    parsed = rpm_hook.parse_plugin_input(lines([AMD63], [AMD62], parent=4242))
    assert (parsed.root, parsed.parent_pid) == ("/", 4242)
    assert parsed.installed == INSTALLED and parsed.incoming == [AMD63] and parsed.outgoing == [AMD62]


@pytest.mark.parametrize("text,what", [
    (lines([AMD63], [], end=False), "cut short"),
    ("root\t/\nX\tamdgpu-dkms\n1\nend\n", "line 2"),
    ("root\t/\n+\tamdgpu-dkms\t1\nend\n", "line 2"),
    ("", "cut short"),
])
def test_parse_names_what_is_wrong(text: str, what: str) -> None:
    """A cut, unknown or short line is an InputFileError naming it, never a traceback."""
    with pytest.raises(InputFileError, match=what):
        rpm_hook.parse_plugin_input(text)


def test_a_mispaired_upgrade_is_refused_with_the_dnf_lines(root: Path) -> None:
    """amdgpu 6.3 over ROCm 6.2 run by rpm by hand: refused (exit 10) with the same REFUSED line as dnf's."""
    code, out = hook(root, lines([AMD63], [AMD62]))
    assert code == exits.EXIT_REFUSED
    assert "REFUSED (amd.pairing)" in out and "nothing was changed" in out


def test_an_unguarded_package_passes(root: Path) -> None:
    """A harmless package's upgrade is allowed and says nothing."""
    assert hook(root, lines([HELLO2], [HELLO])) == (exits.EXIT_ALLOW, "")


def test_cut_input_naming_a_guarded_package_is_refused_by_the_failsafe(root: Path) -> None:
    """Input without its end line is not the whole transaction: the fail-safe refuses it (guarded name seen)."""
    code, out = hook(root, lines([AMD63], [AMD62], end=False))
    assert code == exits.EXIT_FAILSAFE_INPUT and "REFUSED by fail-safe" in out


def test_malformed_input_is_refused_whatever_it_names(root: Path) -> None:
    """Input the plugin never writes (cut, or a line of another kind) is not the whole transaction: refused even
    when the names in it are unguarded, as apt and dnf refuse input they could not read whole."""
    assert hook(root, lines([HELLO2], [HELLO], installed=[HELLO], end=False))[0] == exits.EXIT_FAILSAFE_INPUT
    assert hook(root, "root\t/\nX\thello-fake\nend\n")[0] == exits.EXIT_FAILSAFE_INPUT


def test_the_plan_of_the_parent_zypper_judges_the_whole_commit(root: Path, tmp_path: Path) -> None:
    """The first rpm run of a paired move (amdgpu alone) is allowed when zypper's plan moves ROCm with it."""
    proc = fake_proc(tmp_path, 4242, "zypper", 777)
    steps = [dict(zip(zypper_plan.FIELDS, p), type="+") for p in (AMD63, ROCM63)]
    zypper_plan.write_plan(str(root / "plans"), 4242, 777, steps)
    assert hook(root, lines([AMD63], [AMD62], parent=4242), proc)[0] == exits.EXIT_ALLOW


def test_a_plan_of_an_earlier_process_is_not_believed(root: Path, tmp_path: Path) -> None:
    """A plan whose zypper started at another time (a reused pid) is ignored: the rpm run is judged alone."""
    proc = fake_proc(tmp_path, 4242, "zypper", 778)
    steps = [dict(zip(zypper_plan.FIELDS, p), type="+") for p in (AMD63, ROCM63)]
    zypper_plan.write_plan(str(root / "plans"), 4242, 777, steps)
    assert hook(root, lines([AMD63], [AMD62], parent=4242), proc)[0] == exits.EXIT_REFUSED


def test_a_plan_that_does_not_cover_the_rpm_run_is_not_used(root: Path, tmp_path: Path) -> None:
    """An rpm run bringing in a package the plan does not install is judged by itself."""
    proc = fake_proc(tmp_path, 4242, "zypper", 777)
    zypper_plan.write_plan(str(root / "plans"), 4242, 777, [dict(zip(zypper_plan.FIELDS, HELLO2), type="+")])
    assert hook(root, lines([AMD63], [AMD62], parent=4242), proc)[0] == exits.EXIT_REFUSED


def test_the_commit_plugin_acks_every_frame_and_keeps_the_plan_only_during_the_commit(tmp_path: Path) -> None:
    """PLUGINBEGIN, COMMITBEGIN, COMMITEND, PLUGINEND: four ACKs; the plan exists after COMMITBEGIN only."""
    proc = fake_proc(tmp_path, os.getpid(), "zypper", 99)
    body = ('{"TransactionStepList": [{"type": "+", "solvable": {"n": "rocm-core", "v": "6.3.0.60300", '
            '"r": "39.sles15", "a": "x86_64"}}, {"solvable": {"n": "rocm-core", "v": "6.2.2.60202", "r": "116", '
            '"a": "x86_64"}}]}')
    plans = tmp_path / "plans"
    frames = f"PLUGINBEGIN\n\n\x00COMMITBEGIN\n\n{body}\x00".encode()
    out = io.BytesIO()
    commit_plugin.serve(io.BytesIO(frames), out, io.StringIO(), str(plans), os.getpid(), str(proc))
    assert out.getvalue() == commit_plugin.ACK * 2
    assert not list(plans.iterdir())  # the end of input (zypper gone) removes it too
    steps = zypper_plan.steps_from_commitbegin(body)
    assert steps == [{"type": "+", "name": "rocm-core", "epoch": "", "version": "6.3.0.60300",
                      "release": "39.sles15", "arch": "x86_64"}]


def test_a_bad_commitbegin_body_is_named() -> None:
    """A COMMITBEGIN body that is not the documented step list is an InputFileError naming the field."""
    with pytest.raises(InputFileError, match="TransactionStepList -> 1 -> type"):
        zypper_plan.steps_from_commitbegin('{"TransactionStepList": [{"type": "x", "solvable": {}}]}')
