"""The dnf5 action's entry point against a fake actions plugin speaking the JSON protocol of actions.cpp/actions.8.

dnf5 is not in Debian 12, so the real libdnf5 actions plugin cannot run here: the fake below answers requests the
way libdnf5-plugins/actions/actions.cpp does (one JSON object per line; replies carry op "reply", requested_op,
domain, status and, for get, return keyed by the domain, or keys_val for conf).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from agent.guard.dnf import dnf5_action
from agent.guard.hotpath.decision import EXIT_REFUSED
from agent.policy.load import load_and_compile, write_compiled
from tests.guard.dnf.installroot.harness import TEST_POLICY

REPO = Path(__file__).resolve().parents[3]
NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)


def pkg(name: str, epoch: str, version: str, release: str, arch: str, **extra: str) -> Dict[str, str]:
    return dict({"name": name, "epoch": epoch, "version": version, "release": release, "arch": arch}, **extra)


AMD62 = pkg("amdgpu-dkms", "1", "6.8.5.60202", "2041575.el9", "noarch")
ROCM62 = pkg("rocm-core", "0", "6.2.2.60202", "116.el9", "x86_64")
ROCM63 = pkg("rocm-core", "0", "6.3.0.60300", "39.el9", "x86_64")
KERNEL = pkg("kernel-core", "0", "5.14.0", "427.el9", "x86_64")
INSTALLED = [AMD62, ROCM62, KERNEL]
UPGRADE_ROCM = [dict(ROCM63, direction="IN", action="U"), dict(ROCM62, direction="OUT", action="E")]


class FakeActionsPlugin:
    """Answers get trans_packages/packages/conf and log requests like libdnf5's actions plugin (json mode)."""

    def __init__(self, trans: List[Dict[str, str]], installed: List[Dict[str, str]], installroot: str,
                 garbage: Optional[str] = None) -> None:
        self.trans, self.installed, self.installroot, self.garbage = trans, installed, installroot, garbage
        self.requests: List[Dict[str, Any]] = []
        self.logged: List[tuple] = []

    def reply(self, request: Dict[str, Any]) -> str:
        self.requests.append(request)
        if self.garbage is not None:
            return self.garbage
        out: Dict[str, Any] = {"op": "reply", "requested_op": request["op"]}
        if request["op"] == "log":
            out.update(domain="log", status="OK")
            self.logged.append((request["args"]["level"], request["args"]["message"]))
            return json.dumps(out)
        domain = request["domain"]
        out["domain"] = domain
        args = request["args"]
        if domain == "conf":
            values = {"installroot": self.installroot}
            out.update(status="OK", **{"return": {"keys_val": [{"key": args["key"],
                                                                 "value": values[args["key"]]}]}})
        elif domain in ("trans_packages", "packages"):
            filters = {f["key"] for f in args.get("filters", [])}
            source = self.trans if domain == "trans_packages" else self.installed
            if "installonly" in filters:
                source = [p for p in self.installed + self.trans if p["name"].startswith("kernel")]
            rows = [{k: str(p.get(k, "")) for k in args["output"]} for p in source]
            out.update(status="OK", **{"return": {domain: rows}})
        else:
            out.update(status="ERROR", message=f'Unknown domain "{domain}" for operation "{request["op"]}"')
        return json.dumps(out)

    def serve(self, proc: subprocess.Popen) -> None:
        """Read requests from the action's stdout and answer on its stdin until it closes stdout."""
        for line in proc.stdout:
            if not line.strip():
                continue
            try:
                proc.stdin.write(self.reply(json.loads(line)) + "\n")
                proc.stdin.flush()
            except BrokenPipeError:
                break


@pytest.fixture
def root(tmp_path: Path) -> Path:
    policy = tmp_path / "policy.toml"
    policy.write_text(TEST_POLICY)
    _, compiled = load_and_compile(str(policy))
    write_compiled(str(tmp_path / "var/lib/gpuguard/policy.compiled.json"), compiled)
    return tmp_path


def run_action(root: Path, plugin: FakeActionsPlugin, args: Optional[list] = None) -> tuple:
    """Run the packaged launcher (python3 -I -S, this checkout's agent) as the actions plugin would."""
    script = root / "gpuguard-dnf5-action"
    script.write_text((REPO / "packaging/dnf5/gpuguard-dnf5-action").read_text().replace(
        'GPUGUARD_LIB = "/usr/lib/gpuguard"', f'GPUGUARD_LIB = "{REPO}"'))
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(script), *(args or [])], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    plugin.serve(proc)
    proc.stdin.close()
    err = proc.stderr.read()
    code = proc.wait(timeout=60)
    proc.stdout.close()
    proc.stderr.close()
    assert "Traceback" not in err
    return code, err


def test_violation_exits_non_zero_and_is_logged_to_dnf5(root: Path) -> None:
    """A refusal: REFUSED lines on stderr, sent to dnf5's logger, exit 10 (raise_error=1 aborts dnf5)."""
    plugin = FakeActionsPlugin(UPGRADE_ROCM, INSTALLED, str(root))
    code, err = run_action(root, plugin)
    assert code == EXIT_REFUSED
    assert err.startswith("gpuguard: REFUSED (amd.pairing): amdgpu-dkms 1:6.8.5.60202-2041575.el9, rocm-core "
                          "6.2.2.60202-116.el9 -> 6.3.0.60300-39.el9: breaks the pinned AMD pairing 'rocm-6.2'")
    assert plugin.logged and plugin.logged[0][0] == "ERROR" and "REFUSED (amd.pairing)" in plugin.logged[0][1]
    assert [(r["op"], r.get("domain")) for r in plugin.requests[:4]] == [
        ("get", "trans_packages"), ("get", "packages"), ("get", "packages"), ("get", "conf")]
    event = json.loads((root / "var/lib/gpuguard/guard-events.jsonl").read_text().splitlines()[-1])
    assert (event["tool"], event["rule"]) == ("dnf5", "amd.pairing")


def test_allowed_transaction_exits_0(root: Path) -> None:
    """An allowed dnf5 transaction exits 0 and the action writes nothing to the plugin's log."""
    amd63 = pkg("amdgpu-dkms", "1", "6.10.5.60300", "2084815.el9", "noarch")
    trans = UPGRADE_ROCM + [dict(amd63, direction="IN", action="U"), dict(AMD62, direction="OUT", action="E")]
    plugin = FakeActionsPlugin(trans, INSTALLED, str(root))
    assert run_action(root, plugin) == (0, "")
    assert plugin.logged == []


def test_new_kernel_from_dnf5_is_an_install(root: Path) -> None:
    """A new kernel in a dnf5 transaction is judged as an install of kernel-core@version and refused when not
    allowed."""
    new = pkg("kernel-core", "0", "5.14.0", "570.el9", "x86_64", direction="IN", action="I")
    code, err = run_action(root, FakeActionsPlugin([new], INSTALLED, str(root)))
    assert code == EXIT_REFUSED and "kernel-core@5.14.0-570.el9 (not installed) -> 5.14.0-570.el9" in err


@pytest.mark.parametrize("garbage", ["this is not json", '{"op": "reply", "requested_op": "get", "status": "ERROR", '
                                                        '"message": "Bad json type"}', '{"op": "hello"}'])
def test_garbage_from_dnf5_fails_safe_like_apt(root: Path, garbage: str) -> None:
    """Malformed answers leave the transaction unknown: block-guarded refuses it whatever they name (exit 12)."""
    code, err = run_action(root, FakeActionsPlugin(UPGRADE_ROCM, INSTALLED, str(root), garbage=garbage))
    assert code == 12 and "cannot read the transaction" in err and "Traceback" not in err
    assert "what it does not show may touch guarded packages" in err


def test_garbage_naming_a_guarded_package_is_refused(root: Path) -> None:
    """A broken reply from dnf5 that names a guarded package is refused by the fail-safe (exit 12), with the bypass
    named."""
    garbage = '{"op": "reply", "requested_op": "get", "return": {"trans_packages": [{"name": "rocm-core"'
    code, err = run_action(root, FakeActionsPlugin(UPGRADE_ROCM, INSTALLED, str(root), garbage=garbage))
    assert code == 12 and "REFUSED by fail-safe 'block-guarded'" in err and "rocm-core" in err
    assert "dnf5 --disable-plugin=actions" in err


def test_missing_compiled_policy_fails_safe(root: Path) -> None:
    """Without a compiled policy the dnf5 action refuses by the fail-safe with exit 11."""
    (root / "var/lib/gpuguard/policy.compiled.json").unlink()
    code, err = run_action(root, FakeActionsPlugin(UPGRADE_ROCM, INSTALLED, str(root)))
    assert code == 11 and "no compiled policy" in err


def test_peer_that_closes_the_pipe_is_handled_in_process(root: Path) -> None:
    """No reply at all (dnf5 closed the pipes): the transaction is unknown, the fail-safe refuses, no exception."""
    import io

    err = io.StringIO()
    code = dnf5_action.main(["--root", str(root)], requests=io.BytesIO(), replies=io.BytesIO(b""), err=err,
                            now=lambda: NOW)
    assert code == 12 and "no reply to the get trans_packages request" in err.getvalue()


def test_actions_file_runs_the_launcher_once_at_goal_resolved() -> None:
    """The shipped .actions line: goal_resolved, empty filter (run once), json mode, raise_error=1."""
    lines = [ln for ln in (REPO / "packaging/dnf5/gpuguard.actions").read_text().splitlines()
             if ln and not ln.startswith("#")]
    assert lines == ["goal_resolved:::enabled=1 mode=json raise_error=1:/usr/lib/gpuguard/gpuguard-dnf5-action"]


def test_a_peer_that_never_replies_is_refused_after_the_timeout(root: Path) -> None:
    """dnf5 keeps the pipe open and never answers: refused after --input-timeout-seconds (exit 12), no hang."""
    import io
    import os

    read_fd, write_fd = os.pipe()
    err = io.StringIO()
    with os.fdopen(read_fd, "rb") as replies:
        try:
            code = dnf5_action.main(["--root", str(root), "--input-timeout-seconds", "0.5"], requests=io.BytesIO(),
                                    replies=replies, err=err, now=lambda: NOW)
        finally:
            os.close(write_fd)
    # The pipe stays open until main returns, so only its own timeout can end the wait: returning at all, with this
    # refusal, is the proof, whatever the wall time on a loaded machine.
    assert code == 12
    assert "no end of input after 0.5 seconds" in err.getvalue()
