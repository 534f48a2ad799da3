"""Python distributions pip installed in the system site directories: the amdsmi binding as a host fact."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.hostfacts.context import AMDSMI_BINDING, HostContext, read_host_context
from agent.hostfacts.python_dists import find_distribution, parse_dist_name, site_directories


@pytest.mark.parametrize("entry, expected", [
    ("amdsmi-7.0.2.dist-info", ("amdsmi", "7.0.2")),
    ("amdsmi-26.0.2+39589fda.dist-info", ("amdsmi", "26.0.2+39589fda")),
    ("amdsmi-6.2.0-py3.12.egg-info", ("amdsmi", "6.2.0")),
    ("nvidia_ml_py-12.575.51.dist-info", ("nvidia_ml_py", "12.575.51")),
    ("amdsmi", None), ("amdsmi.dist-info", None), ("README.txt", None),
])
def test_dist_entry_names(entry: str, expected) -> None:
    """``NAME-VERSION.dist-info`` and ``.egg-info`` entries give a normalised name and the version; others none."""
    assert parse_dist_name(entry) == expected


def test_binding_found_in_the_system_site_directories_only(tmp_path: Path) -> None:
    """pip's /usr/local dist-packages (Debian, Ubuntu) and rpm's site-packages are read; a virtual environment
    is not, and a host without one has no binding."""
    assert find_distribution(str(tmp_path), "amdsmi") is None
    (tmp_path / "opt/venv/lib/python3.12/site-packages/amdsmi-7.1.0.dist-info").mkdir(parents=True)
    assert find_distribution(str(tmp_path), "amdsmi") is None
    (tmp_path / "usr/lib64/python3.9/site-packages/amdsmi-6.4.1.dist-info").mkdir(parents=True)
    (tmp_path / "usr/local/lib/python3.12/dist-packages/amdsmi-7.0.2.dist-info").mkdir(parents=True)
    (tmp_path / "usr/lib/python3/dist-packages").mkdir(parents=True)
    assert site_directories(str(tmp_path)) == ["/usr/lib/python3/dist-packages", "/usr/lib64/python3.9/site-packages",
                                               "/usr/local/lib/python3.12/dist-packages"]
    assert find_distribution(str(tmp_path), "amdsmi") == ("6.4.1", "/usr/lib64/python3.9/site-packages")


def test_the_context_reads_the_binding_only_when_asked(tmp_path: Path) -> None:
    """AMDSMI_BINDING puts (version, site directory) in the host context; other facts leave it unread."""
    (tmp_path / "usr/local/lib/python3.12/dist-packages/amdsmi-7.0.2.dist-info").mkdir(parents=True)
    assert read_host_context(str(tmp_path), (AMDSMI_BINDING,)) == HostContext(
        amdsmi_binding=("7.0.2", "/usr/local/lib/python3.12/dist-packages"))
    assert read_host_context(str(tmp_path), ("os_release",)).amdsmi_binding is None
