"""The apt hook end to end over a fake root: decisions, messages, exit codes, fail-safe, overrides, start-up."""

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

from agent.guard.apt import hook as apt_hook
from agent.guard.hotpath import decision as exits
from agent.guard.hotpath.overrides import start_window
from agent.policy.load import load_and_compile, write_compiled
from agent.versions import compare_dpkg

REPO = Path(__file__).resolve().parents[3]
NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
POLICY = """
[policy]
name = "unit"
[amd]
action = "rollback"
[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"
kernels = ["6.1.0-26-amd64"]
[[amd.pairing]]
name = "rocm-6.3"
amdgpu = "6.3.*"
rocm = "6.3.*"
[kernel]
allow = ["6.1.0-2[67]-amd64"]
[[versions]]
name = "toolkit"
packages = ["nvidia-container-toolkit"]
allow = ">= 1.17.3"
action = "warn"
"""
STATUS = "".join(
    f"Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\n"
    f"Description: x\n long text\n\n"
    for name, version in [("amdgpu-dkms", "1:6.8.5.60202-2041575"), ("rocm-core", "6.2.2.60202-116~12"),
                          ("linux-image-6.1.0-26-amd64", "6.1.112-1"), ("vim", "2:9.0.1378-2")])
HEAD = "VERSION 3\nAPT::Architecture=amd64\nCommandLine::AsString=apt-get%20install\n\n"


def line(name: str, old: str, new: str, action: str = "/x.deb") -> str:
    """One action line as apt's dpkgpm.cc writes it: ``<`` install or upgrade, ``>`` removal or downgrade."""
    if old == "-":
        direction = "<"
    elif new == "-":
        direction = ">"
    else:
        order = compare_dpkg(new, old)
        direction = "<" if order > 0 else ">" if order < 0 else "="
    return f"{name} {old} {'-' if old == '-' else 'amd64'} none {direction} {new} amd64 none {action}\n"


def test_line_helper_writes_the_direction_apt_writes() -> None:
    """The helper's direction field: install and upgrade ``<``, removal and downgrade ``>``, reinstall ``=``."""
    assert [line("x", old, new).split()[4] for old, new in
            [("-", "1"), ("1", "1:0"), ("1", "-"), ("2", "1~rc"), ("1", "1")]] == ["<", "<", ">", ">", "="]


def hook_root(base: Path, policy_text: str = POLICY, status: str = STATUS) -> Path:
    """A host root for the hook: dpkg's status file and the policy compiled where the hook reads it."""
    (base / "var/lib/dpkg").mkdir(parents=True)
    (base / "var/lib/dpkg/status").write_text(status)
    policy = base / "policy.toml"
    policy.write_text(policy_text)
    _, compiled = load_and_compile(str(policy))
    write_compiled(str(base / "var/lib/gpuguard/policy.compiled.json"), compiled)
    return base


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return hook_root(tmp_path)


def run_hook(root: Path, text: str, now: dt.datetime = NOW, args: Optional[list] = None) -> Tuple[int, str]:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, text.encode())
    os.close(write_fd)
    err = io.StringIO()
    try:
        code = apt_hook.main(["--root", str(root)] + (args or []), environ={"APT_HOOK_INFO_FD": str(read_fd)},
                             err=err, now=lambda: now)
    finally:
        os.close(read_fd)
    output = err.getvalue()
    assert "Traceback" not in output
    return code, output


def test_allowed_pair_upgrade_exits_0(root: Path) -> None:
    """Driver and ROCm moving together to another allowed pairing."""
    code, out = run_hook(root, HEAD + line("amdgpu-dkms", "1:6.8.5.60202-2041575", "1:6.10.5.60300-1")
                         + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12"))
    assert code == exits.EXIT_ALLOW and out == ""


def test_unrelated_transaction_exits_0(root: Path) -> None:
    """A transaction that touches no guarded package passes silently with exit 0."""
    code, out = run_hook(root, HEAD + line("vim", "2:9.0.1378-2", "2:9.0.1378-3"))
    assert code == 0 and out == ""


def test_breaking_the_pairing_is_refused_with_a_useful_message(root: Path) -> None:
    """The message names the package, the pinned pairing it breaks and how to proceed."""
    code, out = run_hook(root, HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12"))
    assert code == exits.EXIT_REFUSED
    assert "REFUSED (amd.pairing): amdgpu-dkms 1:6.8.5.60202-2041575, rocm-core 6.2.2.60202-116~12 -> " \
           "6.3.0.60300-39~12" in out
    assert "breaks the pinned AMD pairing 'rocm-6.2'" in out
    assert 'gpuguard override start --minutes 60 --reason "..."' in out
    events = (root / "var/lib/gpuguard/guard-events.jsonl").read_text().splitlines()
    assert json.loads(events[-1])["kind"] == "transaction_blocked"


def test_unsupported_kernel_is_refused(root: Path) -> None:
    """A kernel the policy does not allow is refused with exit 10, naming the kernel and both rules it breaks."""
    code, out = run_hook(root, HEAD + line("linux-image-6.1.0-28-amd64", "-", "6.1.119-1"))
    assert code == exits.EXIT_REFUSED
    assert "kernel.allow" in out and "amd.pairing.kernels" in out and "6.1.0-28-amd64" in out


def test_warn_rule_lets_through_with_a_warning(root: Path) -> None:
    """A package under a warn rule passes with exit 0 and a warning naming the rule."""
    code, out = run_hook(root, HEAD + line("nvidia-container-toolkit", "-", "1.16.0-1"))
    assert code == 0 and "warning (versions.toolkit)" in out


def test_open_override_window_allows_and_expired_one_does_not(root: Path) -> None:
    """Windows are honoured only while open; the use is audited."""
    state = root / "var/lib/gpuguard"
    start_window(str(state / "overrides.json"), str(state / "audit.log"), minutes=30, reason="swap driver",
                 max_minutes=60, now=lambda: NOW, opened_by="ops")
    breaking = HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12")
    code, out = run_hook(root, breaking, now=NOW + dt.timedelta(minutes=10))
    assert code == 0 and "override window" in out and "swap driver" in out
    assert '"event":"override_used"' in (state / "audit.log").read_text()
    code, _ = run_hook(root, breaking, now=NOW + dt.timedelta(minutes=31))
    assert code == exits.EXIT_REFUSED


def test_corrupt_override_file_is_ignored_with_a_warning(root: Path) -> None:
    """A corrupt overrides.json is ignored with a warning saying why, and the transaction is judged without windows."""
    (root / "var/lib/gpuguard/overrides.json").write_text("[1, 2")
    code, out = run_hook(root, HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12"))
    assert code == exits.EXIT_REFUSED and "ignoring override windows" in out and "not valid JSON" in out


@pytest.mark.parametrize("compiled_text,fragment", [
    (None, "no compiled policy"),
    ("{", "not valid JSON"),
    ('{"format": 99}', "format 99"),
    ('{"format": 1, "action": "explode", "failsafe": "block-guarded", "guarded": []}', "action 'explode'"),
])
def test_missing_or_invalid_policy_fails_safe(root: Path, compiled_text: Optional[str], fragment: str) -> None:
    """Guarded packages are refused (exit 11), other packages pass with a warning."""
    compiled = root / "var/lib/gpuguard/policy.compiled.json"
    if compiled_text is None:
        compiled.unlink()
    else:
        compiled.write_text(compiled_text)
    code, out = run_hook(root, HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.2.2.60202-116~12"))
    assert code == exits.EXIT_FAILSAFE_POLICY
    assert "REFUSED by fail-safe 'block-guarded'" in out and fragment in out and "rocm-core" in out
    code, out = run_hook(root, HEAD + line("vim", "2:9.0.1378-2", "2:9.0.1378-3"))
    assert code == 0 and "lets this transaction through" in out


@pytest.mark.parametrize("text", ["VERSION 3\n\nrocm-core 6.2.2 amd64\n", "VERSION 3\n\nvim 2 amd64\n"])
def test_malformed_input_fails_safe(root: Path, text: str) -> None:
    """A whole stream that does not parse: refused (12) when it names a guarded package, else let through with a
    warning."""
    code, out = run_hook(root, text)
    if "rocm-core" in text:
        assert code == exits.EXIT_FAILSAFE_INPUT and "cannot read the transaction" in out
    else:
        assert code == 0 and "cannot read the transaction" in out


@pytest.mark.parametrize("text", ["", "\x00\x01binary", "VERSION 3\nAPT::Architecture=amd64\n",
                                  "/var/cache/apt/archives/vim_2%3a9.0.1378-3_amd64.deb\n", "VERSION 9\n\n"])
def test_input_not_read_whole_is_refused_whatever_it_names(root: Path, text: str) -> None:
    """Empty, garbage, cut short or of another protocol: what it does not show may be guarded, so exit 12."""
    code, out = run_hook(root, text)
    assert code == exits.EXIT_FAILSAFE_INPUT and "cannot read the transaction" in out
    assert "what it does not show may touch guarded packages" in out and "lets this transaction through" not in out


@pytest.mark.parametrize("text", [
    "/var/cache/apt/archives/linux-image-6.8.0-41-generic_6.8.0-41.41_amd64.deb\n",  # protocol version 1
    "linux-image-6.8.0-41-generic - - none < 6.8.0-41.41 amd64 none /x.deb\n",  # an action line, no header
    "VERSION 2\nAPT::Architecture=amd64\n\nlinux-image-6.8.0-41-generic - < 6.8.0-41.41 /x.deb\n",
    "VERSION 3\nCommandLine::AsString=apt-get%20install%20linux-image-6.8.0-41-generic\n",  # cut short
    "VERSION 3\n\nlinux-image-6.8.0-41-generic - - none < 1;6.8.0 amd64 none /x.deb\n",  # a version dpkg rejects
])
def test_unreadable_input_naming_a_guarded_package_is_refused(root: Path, text: str) -> None:
    """Input without a blank line, of another protocol version or with a bad field fails closed (exit 12)."""
    code, out = run_hook(root, text)
    assert code == exits.EXIT_FAILSAFE_INPUT
    assert "cannot read the transaction" in out and "it names guarded packages: linux-image-6.8.0-41-generic" in out
    assert "touches no guarded package" not in out


def test_unreadable_input_let_through_says_what_it_recognised(root: Path) -> None:
    """When block-guarded lets unreadable input through, the warning names what it saw, not what it touches."""
    code, out = run_hook(root, "VERSION 3\n\nvim 2:9.0.1378-2 amd64 none < 2:9.0.1378-3 amd64 none /x.rpm\n")
    assert code == exits.EXIT_ALLOW
    assert "action '/x.rpm'" in out and "none of the names it could recognise is guarded: " in out
    assert "vim" in out and "touches no guarded package" not in out


def test_block_all_failsafe_refuses_unguarded_input_too(root: Path) -> None:
    """With failsafe block-all, input of an unknown protocol version is refused with exit 12."""
    compiled = root / "var/lib/gpuguard/policy.compiled.json"
    data = json.loads(compiled.read_text())
    data["failsafe"] = "block-all"
    compiled.write_text(json.dumps(data))
    code, out = run_hook(root, "VERSION 9\n\n")
    assert code == exits.EXIT_FAILSAFE_INPUT and "unknown hook protocol version '9'" in out


def test_internal_error_fails_safe_without_traceback(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in evaluation: one line, fail-safe exit 13."""
    import agent.policy.evaluate

    def broken(*_args: object) -> None:
        raise TypeError("unsupported operand")

    monkeypatch.setattr(agent.policy.evaluate, "evaluate", broken)
    code, out = run_hook(root, HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12"))
    assert code == exits.EXIT_INTERNAL and "internal error (TypeError" in out


def _edit_compiled(root: Path, edit: "object") -> None:
    compiled = root / "var/lib/gpuguard/policy.compiled.json"
    data = json.loads(compiled.read_text())
    edit(data)  # type: ignore[operator]
    compiled.write_text(json.dumps(data))


@pytest.mark.parametrize("edit,fragment", [
    (lambda d: d.update(frozen={"packages": "rocm-core", "action": None}), "frozen -> packages: not a list"),
    (lambda d: d.update(versions=[{"name": "t", "packages": "rocm-core", "allow": "any", "action": None}]),
     "versions -> 1 -> packages: not a list"),
    (lambda d: d["amd"]["pairings"][0].update(amdgpu=5), "amd -> pairings -> 1 -> amdgpu: not a version spec"),
    (lambda d: d["amd"]["pairings"][0].update(amdgpu_package=">= 1;6.8.5"), "neither a dpkg version"),
    (lambda d: d.update(max_override_minutes="240"), "max_override_minutes"),
])
def test_compiled_policy_with_a_wrong_type_fails_safe_on_the_policy(root: Path, edit: object, fragment: str) -> None:
    """A string where a list belongs (and every other wrong type) is an invalid policy (11), never a dropped rule."""
    _edit_compiled(root, edit)
    code, out = run_hook(root, HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12"))
    assert code == exits.EXIT_FAILSAFE_POLICY and fragment in out, out


@pytest.mark.parametrize("raw,fragment", [
    (b'{"format": 1, "name": "\xff\xfe"}', "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 16 levels"),
    (b'{"format": 1, "x": ' + b"[" * 40 + b"]" * 40 + b"}", "nested deeper than 16 levels"),
])
def test_undecodable_or_deep_compiled_policy_is_the_policy_fail_safe(root: Path, raw: bytes, fragment: str) -> None:
    """Not UTF-8, or nested past the parser or the limit: exit 11 like any invalid policy, not 13."""
    (root / "var/lib/gpuguard/policy.compiled.json").write_bytes(raw)
    code, out = run_hook(root, HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12"))
    assert code == exits.EXIT_FAILSAFE_POLICY and fragment in out, out


def test_fifo_in_place_of_the_compiled_policy_does_not_hang(root: Path) -> None:
    """A FIFO is not read (it would block apt forever): exit 11, at once."""
    compiled = root / "var/lib/gpuguard/policy.compiled.json"
    compiled.unlink()
    os.mkfifo(compiled)
    code, out = run_hook(root, HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12"))
    assert code == exits.EXIT_FAILSAFE_POLICY and "not a regular file" in out


def test_oversized_compiled_policy_is_refused_unread(root: Path) -> None:
    """A compiled policy larger than 8 MiB is refused by the fail-safe (exit 11) without being read."""
    (root / "var/lib/gpuguard/policy.compiled.json").write_bytes(b" " * ((8 << 20) + 1))
    code, out = run_hook(root, HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12"))
    assert code == exits.EXIT_FAILSAFE_POLICY and "larger than" in out


def test_bad_arguments_exit_2(root: Path) -> None:
    """An unknown hook argument is refused with exit 2 and 'bad hook arguments'."""
    code, out = run_hook(root, HEAD, args=["--frobnicate"])
    assert code == exits.EXIT_USAGE and "bad hook arguments" in out


def test_stale_compiled_policy_is_flagged(root: Path) -> None:
    """A policy file newer than the compiled policy is flagged by the hook, which still exits 0."""
    policy_dir = root / "etc/gpuguard/policy.d"
    policy_dir.mkdir(parents=True)
    compiled = root / "var/lib/gpuguard/policy.compiled.json"
    os.utime(compiled, (1_000_000, 1_000_000))
    (policy_dir / "10-site.toml").write_text(POLICY)
    code, out = run_hook(root, HEAD + line("vim", "2:9.0.1378-2", "2:9.0.1378-3"))
    assert code == 0 and "changed after the policy was compiled" in out


def test_hook_path_imports_neither_pydantic_nor_structlog(root: Path) -> None:
    """python -X importtime over a real hook run through the packaged launcher: no pydantic, no structlog."""
    launcher = (REPO / "packaging/apt/gpuguard-apt-hook").read_text().replace(
        'GPUGUARD_LIB = "/usr/lib/gpuguard"', f'GPUGUARD_LIB = "{REPO}"')
    script = root / "hook.py"
    script.write_text(launcher)
    text = HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12")
    result = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", str(script), "--root", str(root)],
                            input=text, capture_output=True, text=True, env={"APT_HOOK_INFO_FD": "0"}, timeout=60)
    assert result.returncode == exits.EXIT_REFUSED, result.stderr[-2000:]
    imported = [ln.split("|")[-1].strip() for ln in result.stderr.splitlines() if ln.startswith("import time:")]
    assert "agent.guard.apt.hook" in imported and "agent.policy.evaluate" in imported
    assert not [m for m in imported if m.split(".")[0] in ("pydantic", "pydantic_core", "structlog")]


def test_hand_written_window_is_capped_at_max_override_minutes(root: Path) -> None:
    """A window written into overrides.json until 2099 counts for max_override_minutes (240 here) only."""
    state = root / "var/lib/gpuguard"
    (state / "overrides.json").write_text(json.dumps({"format": 1, "windows": [
        {"id": "hand", "started_at": NOW.isoformat(), "expires_at": "2099-01-01T00:00:00+00:00",
         "reason": "forever", "opened_by": "someone"}]}))
    breaking = HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12")
    code, out = run_hook(root, breaking, now=NOW + dt.timedelta(minutes=239))
    assert code == exits.EXIT_ALLOW and "until 2026-03-01T16:00:00+00:00" in out
    code, out = run_hook(root, breaking, now=NOW + dt.timedelta(minutes=241))
    assert code == exits.EXIT_REFUSED and "override window" not in out


def test_fifo_in_place_of_overrides_is_no_window(root: Path) -> None:
    """A FIFO for overrides.json is not read (no hang): a corrupt file, so no window, refused (10)."""
    os.mkfifo(root / "var/lib/gpuguard/overrides.json")
    code, out = run_hook(root, HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12"))
    assert code == exits.EXIT_REFUSED and "ignoring override windows" in out and "not a regular file" in out


def test_oversized_hook_input_is_refused_unread(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Input past the bound is not parsed: the fail-safe sees the names in what was read (exit 12)."""
    monkeypatch.setattr(apt_hook, "MAX_INPUT_BYTES", 4096)
    text = HEAD + line("linux-image-6.1.0-28-amd64", "-", "6.1.119-1")
    text += line("vim", "2:9.0.1378-2", "2:9.0.1378-3") * 200
    code, out = run_hook(root, text)
    assert code == exits.EXIT_FAILSAFE_INPUT and "larger than 4096 bytes: refused unread" in out
    assert "it names guarded packages: linux-image-6.1.0-28-amd64" in out


@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_unreadable_dpkg_status_fails_safe(root: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A FIFO (no hang) or an oversized file in place of dpkg's status: the installed set is unknown (exit 12)."""
    status = root / "var/lib/dpkg/status"
    if kind == "fifo":
        status.unlink()
        os.mkfifo(status)
    else:
        monkeypatch.setattr(apt_hook, "MAX_STATUS_BYTES", 100)
    code, out = run_hook(root, HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12"))
    assert code == exits.EXIT_FAILSAFE_INPUT and "cannot read the installed set" in out
    assert "it touches guarded packages: rocm-core" in out


def test_fifo_in_place_of_the_events_file_does_not_hang_a_refusal(root: Path) -> None:
    """Recording never blocks: a FIFO for guard-events.jsonl is a warning, and the refusal still stands (10)."""
    os.mkfifo(root / "var/lib/gpuguard/guard-events.jsonl")
    code, out = run_hook(root, HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12"))
    assert code == exits.EXIT_REFUSED and "cannot record to /var/lib/gpuguard/guard-events.jsonl" in out
    assert '"kind":"transaction_blocked"' in (root / "var/lib/gpuguard/audit.log").read_text()



def test_fifo_in_place_of_the_rollback_authorization_refuses_at_once(root: Path) -> None:
    """A FIFO at rollback-authorization.json (read on every refusal) is named and ignored: the packaged launcher
    refuses (10) within seconds instead of holding apt forever."""
    os.mkfifo(root / "var/lib/gpuguard/rollback-authorization.json")
    launcher = (REPO / "packaging/apt/gpuguard-apt-hook").read_text().replace(
        'GPUGUARD_LIB = "/usr/lib/gpuguard"', f'GPUGUARD_LIB = "{REPO}"')
    script = root / "hook.py"
    script.write_text(launcher)
    text = HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12")
    try:
        result = subprocess.run([sys.executable, "-I", "-S", str(script), "--root", str(root)], input=text,
                                capture_output=True, text=True, env={"APT_HOOK_INFO_FD": "0"}, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the hook blocked on a FIFO in place of rollback-authorization.json")
    assert result.returncode == exits.EXIT_REFUSED, result.stderr[-2000:]
    assert (f"{root}/var/lib/gpuguard/rollback-authorization.json: not a regular file: the rollback authorization "
            f"is ignored") in result.stderr
    assert "REFUSED (" in result.stderr


def test_a_refusal_prints_control_characters_of_policy_values_escaped(tmp_path: Path) -> None:
    """A policy and pairing name with NUL and ESC: the refusal's lines on apt's terminal show them as ``\\x00``
    and ``\\x1b``, never raw."""
    hostile = POLICY.replace('name = "unit"', 'name = "unit\\u0000\\u001b[2J"').replace(
        'name = "rocm-6.2"', 'name = "rocm\\u001b]52;c;\\u0007"')
    root = hook_root(tmp_path, hostile)
    code, out = run_hook(root, HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12"))
    assert code == exits.EXIT_REFUSED, out
    assert [c for c in out if ord(c) < 0x20 and c != "\n"] == [], out
    assert "policy 'unit\\x00\\x1b[2J'" in out and "rocm\\x1b]52;c;\\x07" in out


# What an allowed run must not import: each costs the hook about as much as its whole decision (re and enum alone
# about as long as starting Python), and the hook runs before every apt transaction.
HEAVY_MODULES = ("re", "enum", "json", "collections", "functools", "fnmatch", "os", "stat", "datetime", "typing")


def test_an_allowed_run_imports_none_of_the_heavy_stdlib_modules(root: Path) -> None:
    """The packaged way (python3 -I -S), an allowed driver+ROCm upgrade: none of HEAVY_MODULES gets imported."""
    text = HEAD + line("amdgpu-dkms", "1:6.8.5.60202-2041575", "1:6.10.5.60300-1") + line(
        "rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12") + line("vim", "2:9.0.1378-2", "2:9.0.1378-3")
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from agent.guard.apt.hook import main\n"
            "rc = main(['--root', sys.argv[2]])\n"
            f"print(rc, sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(REPO), str(root)], input=text,
                            capture_output=True, text=True, timeout=60, env={"APT_HOOK_INFO_FD": "0"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(" ", 1) == ["0", "[]\n"], (result.stdout, result.stderr)


def test_a_refused_run_still_records_its_events(root: Path) -> None:
    """The lazily imported json/os path of a refusal writes the guard event and the audit line."""
    code, out = run_hook(root, HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12"))
    assert code == 10, out
    events = (root / "var/lib/gpuguard/guard-events.jsonl").read_text().splitlines()
    assert events and '"kind":"transaction_blocked"' in events[-1]
    audit = (root / "var/lib/gpuguard/audit.log").read_text().splitlines()
    assert len(audit) == len(events) and '"event":"transaction_blocked"' in audit[-1]


def _hold(root: Path, phase: str, scheduler: str = "slurm", drained_at: Optional[float] = None) -> None:
    """maintenance.json as agent/integrations/maintenance.py writes it."""
    (root / "var/lib/gpuguard/maintenance.json").write_text(json.dumps({
        "scheduler": scheduler, "node": "vm", "reason": "rollout r43 stage 2", "began_at_seconds": 1.0,
        "drained_by_us": True, "phase": phase, "detail": "", "drained_at_seconds": drained_at}))


ALLOWED_UPGRADE = HEAD + line("amdgpu-dkms", "1:6.8.5.60202-2041575", "1:6.10.5.60300-1") + line(
    "rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12")


def test_a_hold_still_draining_on_slurm_refuses_guarded_changes_until_drained(root: Path) -> None:
    """While Slurm drains the node an allowed guarded upgrade is refused (exit 10, one line naming the rollout and
    the node); once the hold records the node drained it goes through; unguarded changes never wait."""
    _hold(root, "draining")
    code, out = run_hook(root, ALLOWED_UPGRADE)
    assert code == exits.EXIT_REFUSED
    assert out == ("gpuguard: maintenance for rollout r43 stage 2: waiting for Slurm to drain node vm (jobs still "
                   "running); the change will be allowed once it is drained\n")
    assert '"event":"maintenance_wait"' in (root / "var/lib/gpuguard/audit.log").read_text()
    assert run_hook(root, HEAD + line("vim", "2:9.0.1378-2", "2:9.0.1378-3")) == (exits.EXIT_ALLOW, "")
    _hold(root, "held", drained_at=2.0)
    assert run_hook(root, ALLOWED_UPGRADE) == (exits.EXIT_ALLOW, "")


@pytest.mark.parametrize("phase, scheduler", [("draining", "kubernetes"), ("kept", "slurm"),
                                              ("rebooting", "slurm")])
def test_a_kubernetes_or_kept_hold_does_not_wait(root: Path, phase: str, scheduler: str) -> None:
    """Kubernetes' label is enough, a node kept out after a failed check takes changes (its rollback), and so does
    a drained node waiting for the reboot Slurm was asked for."""
    _hold(root, phase, scheduler)
    assert run_hook(root, ALLOWED_UPGRADE) == (exits.EXIT_ALLOW, "")


@pytest.mark.parametrize("text", ['{"scheduler": "slurm"', '{"scheduler": "slurm", "phase": "drained"}', "[]"])
def test_a_damaged_hold_refuses_guarded_changes_only(root: Path, text: str) -> None:
    """A maintenance.json that is not a hold fails closed for guarded packages (one line naming the file) and lets
    unguarded changes through."""
    (root / "var/lib/gpuguard/maintenance.json").write_text(text)
    code, out = run_hook(root, ALLOWED_UPGRADE)
    assert code == exits.EXIT_REFUSED and out.count("\n") == 1
    assert out.startswith("gpuguard: REFUSED: ") and "maintenance.json" in out and "amdgpu-dkms" in out
    assert run_hook(root, HEAD + line("vim", "2:9.0.1378-2", "2:9.0.1378-3")) == (exits.EXIT_ALLOW, "")
