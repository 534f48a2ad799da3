"""The dnf checker over a fake root: decisions, messages, exit codes, fail-safe and override windows as on apt."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Tuple

import pytest

from agent.guard.dnf import check as dnf_check
from agent.guard.dnf.request import request_document
from agent.guard.hotpath import decision as exits
from agent.guard.hotpath.overrides import start_window
from agent.policy.load import load_and_compile, write_compiled
from tests.guard.dnf.installroot.harness import TEST_POLICY

REPO = Path(__file__).resolve().parents[3]
NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
AMD62 = ("amdgpu-dkms", 1, "6.8.5.60202", "2041575.el9", "noarch")
AMD63 = ("amdgpu-dkms", 1, "6.10.5.60300", "2084815.el9", "noarch")
ROCM62 = ("rocm-core", 0, "6.2.2.60202", "116.el9", "x86_64")
ROCM63 = ("rocm-core", 0, "6.3.0.60300", "39.el9", "x86_64")
K427 = ("kernel-core", 0, "5.14.0", "427.el9", "x86_64")
K503 = ("kernel-core", 0, "5.14.0", "503.el9", "x86_64")
K570 = ("kernel-core", 0, "5.14.0", "570.el9", "x86_64")
HELLO, HELLO2 = ("hello-fake", 0, "1.0", "1", "noarch"), ("hello-fake", 0, "1.1", "1", "noarch")
INSTALLED = [AMD62, ROCM62, K427, HELLO]


def request(*items, installed=INSTALLED) -> str:
    return json.dumps(request_document(installed, list(items), command_line="dnf upgrade"))


def upgrade(old, new) -> list:
    return [new + ("in", "Upgrade"), old + ("out", "Upgraded")]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    policy = tmp_path / "policy.toml"
    policy.write_text(TEST_POLICY)
    _, compiled = load_and_compile(str(policy))
    write_compiled(str(tmp_path / "var/lib/gpuguard/policy.compiled.json"), compiled)
    return tmp_path


def check(root: Path, text: str, now: dt.datetime = NOW, args: Optional[list] = None) -> Tuple[int, str]:
    err = io.StringIO()
    code = dnf_check.main(["--root", str(root)] + (args or []), stdin=io.BytesIO(text.encode("utf-8", "replace")),
                          err=err, now=lambda: now)
    out = err.getvalue()
    assert "Traceback" not in out
    assert all(line.startswith("gpuguard: ") for line in out.splitlines())
    return code, out


def test_allowed_pair_upgrade_exits_0_silently(root: Path) -> None:
    """Upgrading driver and ROCm together to another allowed pairing passes silently with exit 0."""
    assert check(root, request(*upgrade(AMD62, AMD63), *upgrade(ROCM62, ROCM63))) == (0, "")


def test_unrelated_upgrade_exits_0(root: Path) -> None:
    """An upgrade of an unguarded package passes silently with exit 0."""
    assert check(root, request(*upgrade(HELLO, HELLO2))) == (0, "")


def test_breaking_the_pairing_is_refused_with_the_apt_message(root: Path) -> None:
    """Same REFUSED line shape as the apt hook, rpm EVRs, event recorded with tool dnf."""
    code, out = check(root, request(*upgrade(ROCM62, ROCM63)))
    assert code == exits.EXIT_REFUSED
    assert out.splitlines()[0] == (
        "gpuguard: REFUSED (amd.pairing): amdgpu-dkms 1:6.8.5.60202-2041575.el9, rocm-core 6.2.2.60202-116.el9 -> "
        "6.3.0.60300-39.el9: breaks the pinned AMD pairing 'rocm-6.2' (amdgpu 6.2.* + ROCm 6.2.*): amdgpu-dkms "
        "1:6.8.5.60202-2041575.el9 (driver 6.2.2) with rocm-core 6.3.0.60300-39.el9 (ROCm 6.3.0) matches no "
        "allowed pairing (allowed: 'rocm-6.2' (amdgpu 6.2.* + ROCm 6.2.*); 'rocm-6.3' (amdgpu 6.3.* + ROCm 6.3.*))")
    assert 'gpuguard override start --minutes 60 --reason "..."' in out and "nothing was changed" in out
    event = json.loads((root / "var/lib/gpuguard/guard-events.jsonl").read_text().splitlines()[-1])
    assert (event["kind"], event["tool"], event["command_line"]) == ("transaction_blocked", "dnf", "dnf upgrade")


def test_a_refusal_names_the_staged_rollout_that_holds_the_host_back(root: Path) -> None:
    """With a rollout notice in the bundle state the refusal adds it as one line, escaped, before the last line."""
    state = root / "var/lib/gpuguard/policy-bundle/state.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"serial": 42, "rollout": "rollout r43-1a2b3c: waiting for stage 2 (soak\x1b[2J)"}))
    code, out = check(root, request(*upgrade(ROCM62, ROCM63)))
    assert code == exits.EXIT_REFUSED
    assert out.splitlines()[-2] == "gpuguard: rollout r43-1a2b3c: waiting for stage 2 (soak\\x1b[2J)"


def test_new_unsupported_kernel_is_refused_and_a_supported_one_installs_beside(root: Path) -> None:
    """A new kernel outside the pairing's kernels is refused (exit 10), a supported one installs beside the old."""
    code, out = check(root, request(K570 + ("in", "Install")))
    assert code == exits.EXIT_REFUSED and "amd.pairing.kernels" in out and "5.14.0-570.el9" in out
    assert check(root, request(K503 + ("in", "Install"))) == (0, "")


def test_open_override_window_allows_and_expired_one_does_not(root: Path) -> None:
    """An open override window lets a breaking upgrade through and audits it; after the window ends it is refused."""
    state = root / "var/lib/gpuguard"
    start_window(str(state / "overrides.json"), str(state / "audit.log"), minutes=30, reason="swap driver",
                 max_minutes=60, now=lambda: NOW, opened_by="ops")
    breaking = request(*upgrade(ROCM62, ROCM63))
    code, out = check(root, breaking, now=NOW + dt.timedelta(minutes=10))
    assert code == 0 and "override window" in out and "swap driver" in out
    assert '"event":"override_used"' in (state / "audit.log").read_text()
    assert check(root, breaking, now=NOW + dt.timedelta(minutes=31))[0] == exits.EXIT_REFUSED


@pytest.mark.parametrize("compiled_text,fragment", [
    (None, "no compiled policy"),
    ("{", "not valid JSON"),
    ('{"format": 99}', "format 99"),
    ('{"format": 1, "action": "explode", "failsafe": "block-guarded", "guarded": []}', "action 'explode'"),
])
def test_missing_or_invalid_policy_fails_safe(root: Path, compiled_text: Optional[str], fragment: str) -> None:
    """Guarded packages are refused (exit 11), other packages pass with a warning: as on apt."""
    compiled = root / "var/lib/gpuguard/policy.compiled.json"
    if compiled_text is None:
        compiled.unlink()
    else:
        compiled.write_text(compiled_text)
    code, out = check(root, request(*upgrade(ROCM62, ROCM63)))
    assert code == exits.EXIT_FAILSAFE_POLICY
    assert "REFUSED by fail-safe 'block-guarded'" in out and fragment in out and "rocm-core" in out
    assert "dnf --disableplugin=gpuguard" in out
    code, out = check(root, request(*upgrade(HELLO, HELLO2)))
    assert code == 0 and "lets this transaction through" in out and len(out.splitlines()) == 1


@pytest.mark.parametrize("text", ["[]", '{"format": 1, "items": [{"name": "rocm-core"}], "installed": []}',
                                  '{"format": 1, "items": [{"name": "hello-fake"}], "installed": []}'])
def test_malformed_input_fails_safe(root: Path, text: str) -> None:
    """A whole JSON document that is not a request: refused (12) when it names a guarded package, else let through
    with one warning."""
    code, out = check(root, text)
    assert "cannot read the transaction" in out
    if "rocm-core" in text:
        assert code == exits.EXIT_FAILSAFE_INPUT and "REFUSED by fail-safe" in out
    else:
        assert code == 0 and len(out.splitlines()) == 1


@pytest.mark.parametrize("raw", [b"", b"{", b"\x00\x01binary", b"garbage hello-fake",
                                 b'{"format": 1, "items": [{"name": "hello-\xff"}], "installed": []}'])
def test_input_not_read_whole_is_refused_whatever_it_names(root: Path, raw: bytes) -> None:
    """Empty, cut JSON, garbage or not UTF-8: what it does not show may be guarded, so exit 12."""
    err = io.StringIO()
    code = dnf_check.main(["--root", str(root)], stdin=io.BytesIO(raw), err=err, now=lambda: NOW)
    out = err.getvalue()
    assert code == exits.EXIT_FAILSAFE_INPUT and "cannot read the transaction" in out, out
    assert "what it does not show may touch guarded packages" in out and "Traceback" not in out


def test_a_plugin_that_never_closes_stdin_is_refused_after_the_timeout(root: Path) -> None:
    """The checker under python3 -I -S with stdin left open by its writer: refused after the timeout (exit 12)."""
    script = Path(__file__).resolve().parents[3] / "packaging/dnf/gpuguard-dnf-check"
    launcher = script.read_text().replace('GPUGUARD_LIB = "/usr/lib/gpuguard"',
                                          f'GPUGUARD_LIB = "{script.parents[2]}"')
    (root / "check.py").write_text(launcher)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, request(*upgrade(ROCM62, ROCM63)).encode())
    try:
        result = subprocess.run([sys.executable, "-I", "-S", str(root / "check.py"), "--root", str(root),
                                 "--input-timeout-seconds", "1"], stdin=read_fd, capture_output=True, text=True,
                                timeout=20)
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert result.returncode == exits.EXIT_FAILSAFE_INPUT, result.stderr
    assert "no end of input after 1 seconds" in result.stderr and "rocm-core" in result.stderr


def test_block_all_failsafe_refuses_unguarded_input_too(root: Path) -> None:
    """With failsafe block-all a request of an unknown format is refused with exit 12."""
    compiled = root / "var/lib/gpuguard/policy.compiled.json"
    data = json.loads(compiled.read_text())
    data["failsafe"] = "block-all"
    compiled.write_text(json.dumps(data))
    code, out = check(root, '{"format": 7}')
    assert code == exits.EXIT_FAILSAFE_INPUT and "request format 7 is not 1" in out


def test_internal_error_fails_safe_without_traceback(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in evaluation: one line, fail-safe exit 13."""
    import agent.policy.evaluate

    def broken(*_args: object) -> None:
        raise TypeError("unsupported operand")

    monkeypatch.setattr(agent.policy.evaluate, "evaluate", broken)
    code, out = check(root, request(*upgrade(ROCM62, ROCM63)))
    assert code == exits.EXIT_INTERNAL and "internal error (TypeError" in out


def test_wrong_type_in_the_compiled_policy_is_the_policy_fail_safe(root: Path) -> None:
    """A spec of the wrong type is caught when the policy is read (exit 11), not when evaluating."""
    compiled = root / "var/lib/gpuguard/policy.compiled.json"
    data = json.loads(compiled.read_text())
    data["amd"]["pairings"][0]["amdgpu"] = 5
    compiled.write_text(json.dumps(data))
    code, out = check(root, request(*upgrade(ROCM62, ROCM63)))
    assert code == exits.EXIT_FAILSAFE_POLICY and "amd -> pairings -> 1 -> amdgpu" in out


def test_bad_arguments_exit_2(root: Path) -> None:
    """An unknown checker argument is refused with exit 2 and names --disableplugin=gpuguard as the bypass."""
    code, out = check(root, request(), args=["--frobnicate"])
    assert code == exits.EXIT_USAGE and "bad checker arguments" in out and "--disableplugin=gpuguard" in out


def test_launcher_runs_stdlib_only_on_the_system_python(root: Path) -> None:
    """The packaged launcher under python3 -I -S: refuses with exit 10 and imports neither pydantic nor structlog."""
    launcher = (REPO / "packaging/dnf/gpuguard-dnf-check").read_text().replace(
        'GPUGUARD_LIB = "/usr/lib/gpuguard"', f'GPUGUARD_LIB = "{REPO}"')
    script = root / "check.py"
    script.write_text(launcher)
    result = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", str(script), "--root", str(root)],
                            input=request(*upgrade(ROCM62, ROCM63)), capture_output=True, text=True, timeout=60)
    assert result.returncode == exits.EXIT_REFUSED, result.stderr[-2000:]
    imported = [ln.split("|")[-1].strip() for ln in result.stderr.splitlines() if ln.startswith("import time:")]
    assert "agent.guard.dnf.check" in imported
    assert not [m for m in imported if m.split(".")[0] in ("pydantic", "pydantic_core", "structlog")]


def test_launcher_without_the_agent_warns_and_lets_through(tmp_path: Path) -> None:
    """A broken install must not block dnf (including the repair), as with the apt launcher."""
    script = tmp_path / "check.py"
    script.write_text((REPO / "packaging/dnf/gpuguard-dnf-check").read_text().replace(
        'GPUGUARD_LIB = "/usr/lib/gpuguard"', f'GPUGUARD_LIB = "{tmp_path / "nothing"}"'))
    result = subprocess.run([sys.executable, "-I", "-S", str(script)], input="{}", capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and "is NOT checked" in result.stderr


def test_oversized_request_is_refused_unread(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request past the bound is input the checker refuses to parse (exit 12), not an internal error."""
    monkeypatch.setattr(dnf_check, "MAX_INPUT_BYTES", 200)
    code, out = check(root, request(*upgrade(ROCM62, ROCM63)))
    assert code == exits.EXIT_FAILSAFE_INPUT and "larger than 200 bytes: refused unread" in out


def test_a_hold_still_draining_on_slurm_refuses_until_drained(root: Path) -> None:
    """As on apt: a guarded upgrade waits (exit 10, one line) while Slurm drains the node, and goes through once
    the hold records it drained."""
    hold = {"scheduler": "slurm", "node": "gpu7", "reason": "rollout r43 stage 2", "began_at_seconds": 1.0,
            "drained_by_us": True, "phase": "draining", "detail": ""}
    path = root / "var/lib/gpuguard/maintenance.json"
    path.write_text(json.dumps(hold))
    text = request(*upgrade(AMD62, AMD63), *upgrade(ROCM62, ROCM63))
    code, out = check(root, text)
    assert code == exits.EXIT_REFUSED and out == (
        "gpuguard: maintenance for rollout r43 stage 2: waiting for Slurm to drain node gpu7 (jobs still running); "
        "the change will be allowed once it is drained\n")
    path.write_text(json.dumps({**hold, "phase": "held", "drained_at_seconds": 2.0}))
    assert check(root, text) == (0, "")


GG, GG2 = ("gpuguard", 0, "0.1.0", "1.el9", "x86_64"), ("gpuguard", 0, "0.1.1", "1.el10", "x86_64")


def test_erasing_gpuguard_itself_is_refused_as_self_protection(root: Path) -> None:
    """dnf remove gpuguard: refused and named as gpuguard's own removal, as on apt (docs/guard.md)."""
    code, out = check(root, request(GG + ("out", "Erase"), installed=INSTALLED + [GG]))
    assert code == exits.EXIT_REFUSED
    assert "REFUSED (self-protection): this transaction removes gpuguard itself" in out and "0.1.0-1.el9" in out


def test_upgrading_gpuguard_itself_is_not_self_removal(root: Path) -> None:
    """A newer gpuguard replacing the installed one passes silently."""
    assert check(root, request(*upgrade(GG, GG2), installed=INSTALLED + [GG])) == (0, "")
