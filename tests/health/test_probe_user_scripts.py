"""The package scripts create the probe's user once, with the GPU device groups that exist (fake user commands)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable, List

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(30)

# Stand-ins for the user database commands: state in $FAKE (users, groups-of-user), every call logged.
STUBS = {
    "getent": """case "$1" in
  passwd) [ -e "$FAKE/user-$2" ] ;;
  group) [ "$2" = render ] || [ "$2" = video ] ;;
esac""",
    "useradd": 'echo "useradd $*" >> "$FAKE/log"; for a; do last=$a; done; touch "$FAKE/user-$last"',
    "usermod": 'echo "usermod $*" >> "$FAKE/log"; echo "$3" >> "$FAKE/groups"',
    "id": 'echo "gpuguard-probe $(cat "$FAKE/groups" 2>/dev/null | tr "\\n" " ")"',
    "mkdir": 'echo "mkdir $*" >> "$FAKE/log"',
    "chown": 'echo "chown $*" >> "$FAKE/log"',
    "chmod": 'echo "chmod $*" >> "$FAKE/log"',
}


def deb_snippet() -> str:
    text = (REPO / "packaging" / "deb" / "gpuguard.postinst").read_text()
    start = text.index("probe_user() {")
    end = text.index("\n}\n", start) + 3
    return 'warn() { echo "warning: $*" >&2; }\n' + text[start:end] + "probe_user\n"


def rpm_snippet() -> str:
    text = (REPO / "packaging" / "rpm" / "gpuguard.spec.in").read_text()
    start = text.index("if ! getent passwd gpuguard-probe")
    end = text.index("    done\nfi\n", start) + len("    done\nfi\n")
    return 'warn() { echo "warning: $*" >&2; }\n' + text[start:end]


def run_twice(tmp_path: Path, script: str) -> List[str]:
    bin_dir, fake = tmp_path / "bin", tmp_path / "fake"
    bin_dir.mkdir()
    fake.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE": str(fake)}
    for _ in range(2):
        done = subprocess.run(["sh", "-eu", "-c", script], env=env, capture_output=True, text=True, timeout=20)
        assert done.returncode == 0 and not done.stderr, done.stderr
    return (fake / "log").read_text().splitlines()


@pytest.mark.parametrize("snippet", [deb_snippet, rpm_snippet], ids=["deb postinst", "rpm %post"])
def test_user_created_once_with_device_groups(tmp_path: Path, snippet: Callable[[], str]) -> None:
    """Two installs: one useradd (system, no login, own home), video and render added once, the home made 0700."""
    log = run_twice(tmp_path, snippet())
    useradds = [line for line in log if line.startswith("useradd")]
    assert useradds == ["useradd --system --user-group --home-dir /var/lib/gpuguard-probe --create-home "
                        "--shell /usr/sbin/nologin --comment gpuguard health probe gpuguard-probe"]
    assert [line for line in log if line.startswith("usermod")] == [
        "usermod -a -G video gpuguard-probe", "usermod -a -G render gpuguard-probe"]
    assert log.count("chmod 0700 /var/lib/gpuguard-probe") == 2
    assert os.path.exists(tmp_path / "fake" / "user-gpuguard-probe")
