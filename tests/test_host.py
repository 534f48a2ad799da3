"""The host seam: reads under a root, symlink resolution inside the root, commands and library loading."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent.errors import CommandNotFound, CommandTimeout, LibraryUnavailable
from agent.host import Host, SubprocessRunner


def test_reads_are_relative_to_root(tmp_path: Path) -> None:
    """/etc/x on the Host is <root>/etc/x on disk; a missing file reads as None."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/x").write_text("value\nsecond\n")
    host = Host(root=tmp_path)
    assert host.read_first_line("/etc/x") == "value"
    assert host.read_text("/etc/missing") is None
    assert host.list_dir("/nope") == []


def test_resolve_follows_absolute_links_inside_root(tmp_path: Path) -> None:
    """An absolute link target is resolved under the root, never on the real machine, through several hops."""
    (tmp_path / "opt/rocm-7.0.2/.info").mkdir(parents=True)
    (tmp_path / "etc/alternatives").mkdir(parents=True)
    (tmp_path / "etc/alternatives/rocm").symlink_to("/opt/rocm-7.0.2")
    (tmp_path / "opt/rocm").symlink_to("/etc/alternatives/rocm")
    (tmp_path / "opt/rel").symlink_to("rocm-7.0.2")
    host = Host(root=tmp_path)
    assert host.resolve("/opt/rocm") == "/opt/rocm-7.0.2"
    assert host.resolve("/opt/rocm/.info") == "/opt/rocm-7.0.2/.info"
    assert host.resolve("/opt/rel") == "/opt/rocm-7.0.2"


def test_resolve_stops_on_link_loops(tmp_path: Path) -> None:
    """A symlink loop ends instead of spinning forever."""
    (tmp_path / "a").symlink_to("/b")
    (tmp_path / "b").symlink_to("/a")
    assert Host(root=tmp_path).resolve("/a") in ("/a", "/b")


def test_subprocess_runner_maps_errors() -> None:
    """Missing programs and timeouts become gpuguard errors, output is captured."""
    runner = SubprocessRunner()
    result = runner([sys.executable, "-c", "print('hi')"], 120)
    assert result.stdout == "hi\n" and result.returncode == 0
    with pytest.raises(CommandNotFound):
        runner(["/nonexistent/program"], 5)
    with pytest.raises(CommandTimeout):
        runner([sys.executable, "-c", "import time; time.sleep(120)"], 0.3)


def test_for_root_refuses_live_libraries_on_foreign_roots(tmp_path: Path) -> None:
    """Reading a fixture or chroot must not load this machine's GPU libraries."""
    host = Host.for_root(str(tmp_path))
    assert not host.is_live
    with pytest.raises(LibraryUnavailable):
        host.load_module("pynvml")
