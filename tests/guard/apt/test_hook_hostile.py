"""The apt hook run as apt runs it (packaged launcher, python3 -I -S, protocol version 3 on fd 20) over hostile
input: a stream that would be refused whole stays refused whatever cut, protocol version or byte garbage it gets
(bounded hypothesis run: derandomized, 250 examples, 20 s deadline each), and no read of fd 20 waits for ever."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.guard.hotpath import decision as exits
from tests.guard.apt.test_hook import HEAD, REPO, hook_root, line

ROCM_UP = line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12", "/var/cache/apt/archives/r_6.3_amd64.deb")
KERNEL_IN = line("linux-image-6.1.0-28-amd64", "-", "6.1.119-1", "/var/cache/apt/archives/l_6.1.119-1_amd64.deb")
VIM_UP = line("vim", "2:9.0.1378-2", "2:9.0.1378-3", "/var/cache/apt/archives/vim_2%3a9.0.1378-3_amd64.deb")
# Complete streams the policy refuses (exit 10): every mangled copy of them must be refused too.
REFUSED_WHOLE = [
    HEAD + ROCM_UP + ROCM_UP.replace("/var/cache/apt/archives/r_6.3_amd64.deb", "**CONFIGURE**"),
    HEAD + VIM_UP + KERNEL_IN,
    "VERSION 3\nAPT::Architecture=amd64\nquiet=1\nCommandLine::AsString=apt-get%20install%20vim\n"
    "Dir::Etc::trusted=trusted.gpg\n\n" + VIM_UP + ROCM_UP + VIM_UP.replace(VIM_UP.split()[-1], "**CONFIGURE**"),
]
# Bytes apt never writes outside a .deb path's name: controls, NUL, DEL, bytes that are not UTF-8, non-ASCII.
BAD_BYTES = [b"\x00", b"\x01", b"\x1b[2J", b"\t", b"\r", b"\x7f", b"\xff", b"\xc3", b"\x80", b"\xc3\xa9",
             b"\xef\xbb\xbf"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = hook_root(tmp_path_factory.mktemp("hostileroot"))
    launcher = (REPO / "packaging/apt/gpuguard-apt-hook").read_text().replace(
        'GPUGUARD_LIB = "/usr/lib/gpuguard"', f'GPUGUARD_LIB = "{REPO}"')
    (base / "gpuguard-apt-hook").write_text(launcher)
    yield base


def run_as_apt(root: Path, data: bytes, close_writer: bool = True, extra: Optional[List[str]] = None,
               timeout_seconds: float = 120) -> Tuple[int, str, float]:
    """Run the launcher as apt does (bash: dash takes no fd above 9), the input on fd 20, APT_HOOK_INFO_FD=20;
    exit code, stderr and seconds taken. ``close_writer=False`` keeps the write end open (a writer never closing)."""
    read_fd, write_fd = os.pipe()
    assert len(data) < 60000  # fits the pipe: written before the hook starts
    os.write(write_fd, data)
    if close_writer:
        os.close(write_fd)
    argv = ["/bin/bash", "-c", f'exec "$@" 20<&{read_fd}', "bash", sys.executable, "-I", "-S",
            str(root / "gpuguard-apt-hook"), "--root", str(root)] + (extra or [])
    started = time.monotonic()
    try:
        result = subprocess.run(argv, pass_fds=(read_fd,), capture_output=True, timeout=timeout_seconds,
                                env={"APT_HOOK_INFO_FD": "20", "PATH": "/usr/bin:/bin"})
    finally:
        os.close(read_fd)
        if not close_writer:
            os.close(write_fd)
    return result.returncode, result.stderr.decode("utf-8", errors="replace"), time.monotonic() - started


def assert_refused(code: int, err: str, data: bytes) -> None:
    """Non-zero exit, every line gpuguard's own, no traceback; a fail-safe refusal is one REFUSED line (the policy
    refuses in one line per rule broken)."""
    lines = err.splitlines()
    assert code != 0, (data, err)
    assert "Traceback" not in err and all(ln.startswith("gpuguard: ") for ln in lines), (data, err)
    refused = [ln for ln in lines if "REFUSED" in ln]
    assert refused and (code == exits.EXIT_REFUSED or len(refused) == 1), (data, err)


@pytest.mark.parametrize("text", REFUSED_WHOLE)
def test_each_base_stream_is_refused_whole(root: Path, text: str) -> None:
    """The streams the fuzz mangles are refused by the policy itself (exit 10) when nothing is wrong with them."""
    code, err, _ = run_as_apt(root, text.encode())
    assert code == exits.EXIT_REFUSED, err


def cut_points(text: str) -> List[int]:
    """Every place a cut leaves input that is not a whole stream: not the end, not just after an action line's
    newline (the protocol has no end marker: a stream cut there is a shorter transaction, indistinguishable)."""
    body = text.index("\n\n") + 2
    return [i for i in range(len(text)) if not (i >= body and text[i - 1] == "\n")]


@st.composite
def hostile_inputs(draw: st.DrawFn) -> bytes:
    text = draw(st.sampled_from(REFUSED_WHOLE))
    kind = draw(st.sampled_from(["cut", "version", "garbage", "garbage+cut", "around"]))
    data = text.encode()
    if kind == "version":
        version = draw(st.one_of(st.sampled_from(["1", "2", "4", "03", "3.0", " 3", "3 ", "", "three", "3\r"]),
                                 st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=6)))
        if version == "3":
            version = "33"
        header = draw(st.sampled_from([f"VERSION {version}\n", f"version {version}\n", ""]))
        return header.encode() + data[len("VERSION 3\n"):]
    if kind in ("garbage", "garbage+cut"):
        garbage = draw(st.one_of(st.sampled_from(BAD_BYTES), st.binary(min_size=1, max_size=6).filter(
            lambda b: any(ch < 32 and ch != 10 or ch > 126 for ch in b))))
        at = draw(st.integers(0, len(data)))
        data = data[:at] + garbage + data[at:]
        if kind == "garbage":
            return data
        return data[:draw(st.integers(at + len(garbage), len(data)))]  # a cut that keeps the garbage
    if kind == "around":
        before = draw(st.binary(max_size=8))
        after = draw(st.binary(min_size=1, max_size=8).filter(lambda b: b.strip(b"\n") != b""))
        return before + data + after
    points = cut_points(text)
    return data[:points[draw(st.integers(0, len(points) - 1))]]


# No deadline: an example's wall time is the machine's load; a hang ends at run_as_apt's timeout instead.
@settings(max_examples=250, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=hostile_inputs())
def test_mangled_stream_naming_a_guarded_package_is_refused(root: Path, data: bytes) -> None:
    """Cut anywhere, another protocol version, byte garbage in or around it: refused in one line, no traceback."""
    code, err, _ = run_as_apt(root, data)
    assert_refused(code, err, data)


def test_a_writer_that_never_closes_is_refused_after_the_timeout(root: Path) -> None:
    """apt's end of fd 20 left open: the hook waits --input-timeout-seconds, then refuses in one line (exit 12)."""
    # The writer never closes: without the hook's own timeout, run_as_apt's (120 s) would fail the test.
    code, err, _ = run_as_apt(root, (HEAD + ROCM_UP).encode(), close_writer=False,
                              extra=["--input-timeout-seconds", "1"])
    assert code == exits.EXIT_FAILSAFE_INPUT, err
    assert "no end of input after 1 seconds" in err and "it names guarded packages: rocm-core" in err
    assert_refused(code, err, b"")


def test_a_writer_that_never_writes_is_refused_after_the_timeout(root: Path) -> None:
    """Nothing at all on fd 20 and never an end: refused after the timeout though it names nothing (exit 12)."""
    code, err, _ = run_as_apt(root, b"", close_writer=False, extra=["--input-timeout-seconds", "0.5"])  # as above
    assert code == exits.EXIT_FAILSAFE_INPUT, err
    assert "no end of input after 0.5 seconds" in err and "what it does not show may touch guarded" in err


@pytest.mark.parametrize("value", ["0", "-1", "x", "nan", "1e9"])
def test_a_bad_input_timeout_is_a_bad_argument(root: Path, value: str) -> None:
    """--input-timeout-seconds must be a number of seconds in (0, 86400): anything else is exit 2."""
    code, err, _ = run_as_apt(root, (HEAD + VIM_UP).encode(), extra=["--input-timeout-seconds", value])
    assert code == exits.EXIT_USAGE and "--input-timeout-seconds" in err
