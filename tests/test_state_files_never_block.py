"""A FIFO in place of a state, config or lock file is refused at once by every opener (issue 39), never waited on.

One case per opener outside the hot path and the daemon's forwarder (those have their own tests): each puts a FIFO
with no writer (or no reader) where the file belongs, and the call must return or raise within seconds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Dict

import pytest

from agent.errors import CommandError, ConfigError, HostReadError, InputFileError
from agent.host import Host
from tests.conftest import within_seconds


def _host_read_text(fifo: Path) -> None:
    with pytest.raises(HostReadError, match="not a regular file"):
        Host(root=fifo.parent).read_text("/" + fifo.name)


def _host_read_bytes(fifo: Path) -> None:
    with pytest.raises(HostReadError, match="not a regular file"):
        Host(root=fifo.parent).read_bytes("/" + fifo.name)


def _host_read_text_head(fifo: Path) -> None:
    with pytest.raises(HostReadError, match="not a regular file"):
        Host(root=fifo.parent).read_text("/" + fifo.name, max_chars=10)


def _ca_bundle(fifo: Path) -> None:
    from agent.report.credentials import check_ca_bundle

    with pytest.raises(ConfigError, match="not a regular file"):
        check_ca_bundle(str(fifo))


def _keyring(fifo: Path) -> None:
    from agent.bundle.verify import keyring_problem

    problem = keyring_problem(Host(root=fifo.parent), [str(fifo)], keys_dir="/")
    assert problem is not None and str(fifo) in problem and "not a regular file" in problem


def _package_manager_lock(fifo: Path) -> None:
    from agent.guard.locks import record_lock_is_free

    with pytest.raises(CommandError, match="not a regular file"):
        record_lock_is_free(str(fifo))


def _dnf_pid_lock(fifo: Path) -> None:
    from agent.guard.dnf.tool import _dnf_lock_holder

    assert _dnf_lock_holder(str(fifo)) is None


def _hub_tokens(fifo: Path) -> None:
    from agent.hub.tokens import read_tokens_file

    with pytest.raises(ConfigError, match="not a regular file"):
        read_tokens_file(str(fifo))


def _health_last_result(fifo: Path) -> None:
    from agent.health.last import load_last_result
    from agent.statepaths import StatePaths

    target = Path(StatePaths(str(fifo.parent)).health_last_result)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(fifo, target)
    with pytest.raises(InputFileError, match="not a regular file"):
        load_last_result(str(fifo.parent))


def _health_baselines(fifo: Path) -> None:
    from agent.health.baseline import BaselineStore

    with pytest.raises(InputFileError, match="not a regular file"):
        BaselineStore(fifo).load()


def _health_check_lock_record(fifo: Path) -> None:
    from agent.health.checklock import read_holder
    from agent.statepaths import StatePaths

    target = Path(StatePaths(str(fifo.parent)).health_check_lock)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(fifo, target)
    assert read_holder(str(fifo.parent)) is None


def _health_baselines_lock(fifo: Path) -> None:
    from agent.health.baseline import BaselineStore

    os.rename(fifo, fifo.parent / ".baselines.lock")
    with pytest.raises(OSError, match="not a regular file|No such device"):
        with BaselineStore(fifo.parent / "baselines.json").locked():
            pass


def _bundle_lock(fifo: Path) -> None:
    from agent.bundle.install import _locked

    os.rename(fifo, fifo.parent / ".lock")
    with pytest.raises(OSError, match="not a regular file|No such device"):
        with _locked(fifo.parent):
            pass


def _debian_reboot_pkgs(fifo: Path) -> None:
    from agent.guard.rollback.health import DEBIAN_REBOOT_REQUIRED, mark_debian_reboot_required

    host = Host(root=fifo.parent)
    pkgs = host.path(DEBIAN_REBOOT_REQUIRED + ".pkgs")
    pkgs.parent.mkdir(parents=True, exist_ok=True)
    os.rename(fifo, pkgs)
    mark_debian_reboot_required(host, ["amdgpu-dkms"])
    assert pkgs.read_text() == "amdgpu-dkms\n"  # the FIFO replaced by the list


OPENERS: Dict[str, Callable[[Path], None]] = {
    "host_read_text": _host_read_text, "host_read_bytes": _host_read_bytes, "host_read_text_head": _host_read_text_head,
    "ca_bundle": _ca_bundle, "keyring": _keyring, "package_manager_lock": _package_manager_lock,
    "dnf_pid_lock": _dnf_pid_lock, "hub_tokens": _hub_tokens, "health_last_result": _health_last_result,
    "health_baselines": _health_baselines, "debian_reboot_pkgs": _debian_reboot_pkgs,
    "health_check_lock_record": _health_check_lock_record, "health_baselines_lock": _health_baselines_lock,
    "bundle_lock": _bundle_lock,
}


@pytest.mark.parametrize("name", sorted(OPENERS))
def test_a_fifo_in_place_of_the_file_is_refused_at_once(tmp_path: Path, name: str) -> None:
    """The opener refuses (or skips) a FIFO without waiting for a writer."""
    fifo = tmp_path / "state-file"
    os.mkfifo(fifo, 0o600)
    with within_seconds(5):
        OPENERS[name](fifo)
