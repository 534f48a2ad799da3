"""The packages ship bash and zsh completion where each family's shells look, generated from the real parser."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Dict

from tests.packaging.test_build import deb_listing, rpm_query, unpack_rpm
from tests.test_completion import bash_complete, top_level_commands

BASH = "/usr/share/bash-completion/completions/gpuguard"


def test_deb_installs_completion_for_bash_and_zsh(debian12: Dict[str, Path], tmp_path: Path) -> None:
    """Debian: bash-completion's completions/ and zsh's vendor-completions/; the bash file completes the commands."""
    deb = debian12["gpuguard"]
    files = deb_listing(deb)
    assert files[BASH] == "-rw-r--r--"
    assert files["/usr/share/zsh/vendor-completions/_gpuguard"] == "-rw-r--r--"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True, timeout=120)
    assert bash_complete(tmp_path / BASH.lstrip("/"), "gpuguard ") == top_level_commands()
    assert (tmp_path / "usr/share/zsh/vendor-completions/_gpuguard").read_text().startswith("#compdef gpuguard\n")


def test_rpm_installs_completion_for_bash_and_zsh(el9: Dict[str, Path], tmp_path: Path) -> None:
    """RHEL: the same bash path, zsh's site-functions/; the bash file completes the commands."""
    rpm = el9["gpuguard"]
    modes = dict(line.split(" ", 1)[::-1] for line in rpm_query(rpm, "--qf", "[%{FILEMODES:perms} %{FILENAMES}\n]"))
    assert modes[BASH] == "-rw-r--r--"
    assert modes["/usr/share/zsh/site-functions/_gpuguard"] == "-rw-r--r--"
    unpack_rpm(rpm, tmp_path)
    assert bash_complete(tmp_path / BASH.lstrip("/"), "gpuguard ") == top_level_commands()
