"""The apt hook on generated input: never a traceback, and input naming a guarded package that cannot be fully
parsed is always refused (bounded hypothesis run: 300 examples, no deadline)."""

from __future__ import annotations

import datetime as dt
import io
import os
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.errors import InputFileError
from agent.guard.apt import hook as apt_hook
from agent.guard.apt.protocol import parse_hook_input
from agent.guard.hotpath import decision as exits
from tests.guard.apt.test_hook import hook_root

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
POLICY = """
[policy]
name = "fuzz"
[amd]
[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"
[kernel]
allow = ["6.1.0-26-amd64"]
"""
STATUS = "".join(f"Package: {n}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {v}\n\n" for n, v in [
    ("amdgpu-dkms", "1:6.8.5.60202-2041575"), ("rocm-core", "6.2.2.60202-116~12"), ("vim", "2:9.0.1378-2")])
GUARDED = ["linux-image-6.8.0-41-generic", "amdgpu-dkms", "rocm-core", "nvidia-driver-580", "cuda-cudart-13-0"]
OTHERS = ["vim", "libssl3", "hello"]
VERSIONS = ["6.8.0-41.41", "1:6.8.5.60202-2041575", "6.3.0.60300-39~12", "2:9.0.1378-3", "-",
            "1;6.8.5.60202-2041575.24.04", "1.17.3-", "x:1", "", "1 2", "é1"]
CODES = {exits.EXIT_ALLOW, exits.EXIT_REFUSED, exits.EXIT_FAILSAFE_POLICY, exits.EXIT_FAILSAFE_INPUT,
         exits.EXIT_INTERNAL}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield hook_root(tmp_path_factory.mktemp("fuzzroot"), POLICY, STATUS)


names = st.sampled_from(GUARDED + OTHERS)
versions = st.sampled_from(VERSIONS)
v3_line = st.builds(lambda n, o, a, ma, d, v, act: f"{n} {o} {a} {ma} {d} {v} {a} {ma} {act}",
                    names, versions, st.sampled_from(["amd64", "-", "i386", "AMD64"]),
                    st.sampled_from(["none", "same", "odd"]), st.sampled_from(["<", ">", "=", "~"]), versions,
                    st.sampled_from(["**CONFIGURE**", "**REMOVE**", "/var/cache/apt/archives/x_1_amd64.deb", "x"]))
v2_line = st.builds(lambda n, o, d, v: f"{n} {o} {d} {v} /x.deb", names, versions, st.sampled_from("<>="), versions)
deb_line = st.builds(lambda n, v: f"/var/cache/apt/archives/{n}_{v.replace(':', '%3a')}_amd64.deb", names, versions)
junk_line = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
header = st.sampled_from(["VERSION 3\n", "VERSION 2\n", "VERSION 1\n", "VERSION 9\n", "", "version 3\n"])
config = st.lists(st.sampled_from(["APT::Architecture=amd64", "CommandLine::AsString=apt-get%20install%20rocm-core",
                                   "quiet=1", "no equals"]), max_size=3)
inputs = st.builds(
    lambda h, c, sep, body, cut: (h + "".join(x + "\n" for x in c) + sep + "".join(x + "\n" for x in body))[:cut],
    header, config, st.sampled_from(["\n", ""]),
    st.lists(st.one_of(v3_line, v3_line, v2_line, deb_line, junk_line), max_size=8),
    st.integers(min_value=0, max_value=2000))


def run_hook(root: Path, text: str) -> "tuple[int, str]":
    read_fd, write_fd = os.pipe()
    os.write(write_fd, text.encode("utf-8", errors="surrogatepass"))
    os.close(write_fd)
    err = io.StringIO()
    try:
        code = apt_hook.main(["--root", str(root), "--state-dir", "/fuzz-state"],
                             environ={"APT_HOOK_INFO_FD": str(read_fd)}, err=err, now=lambda: NOW)
    finally:
        os.close(read_fd)
    return code, err.getvalue()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(text=inputs)
def test_unparsable_input_naming_a_guarded_package_is_refused(root: Path, text: str) -> None:
    """No traceback, a documented exit code, and no unreadable input that names a guarded package gets through."""
    code, out = run_hook(root, text)
    assert "Traceback" not in out and code in CODES, (text, out)
    try:
        parse_hook_input(text)
        parsed = True
    except InputFileError:
        parsed = False
    if not parsed and any(name in text for name in GUARDED):
        assert code == exits.EXIT_FAILSAFE_INPUT, (text, out)
        assert "touches no guarded package" not in out
