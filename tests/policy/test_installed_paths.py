"""Paths that policy messages and the install scripts name exist where the .deb/.rpm install them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = (REPO / "packaging/build.py").read_text()
COMMANDS = sorted(str(p.relative_to(REPO)) for p in (REPO / "agent/commands").glob("*.py"))
GUARD_COMMANDS = [f"agent/commands/{name}.py" for name in ("policy", "pin", "override", "guard", "guard_inputs")]
SPEAKERS = ["agent/policy/load.py", "agent/policy/semantic.py", "agent/policy/matrix.py", *COMMANDS,
            "agent/cli.py", "packaging/deb/gpuguard.postinst", "packaging/rpm/gpuguard.spec.in"]
NAMED = sorted({m for f in SPEAKERS for m in re.findall(r"/(?:usr/share/doc/gpuguard|usr/share/gpuguard|etc/gpuguard)"
                                                         r"/[\w.-]+\.(?:md|toml)", (REPO / f).read_text())})


def test_the_messages_name_installed_files_not_repository_paths() -> None:
    """Messages name files where the packages install them, never paths of the source repository."""
    assert "/etc/gpuguard/example-policy.toml" in NAMED and "/usr/share/doc/gpuguard/guard.md" in NAMED
    for f in ("agent/policy/load.py", "agent/policy/semantic.py", *GUARD_COMMANDS, "packaging/deb/gpuguard.postinst"):
        strings = re.findall(r'"[^"\n]*"', (REPO / f).read_text())
        assert not [s for s in strings if "policies/" in s or "docs/" in s], f


@pytest.mark.parametrize("path", NAMED)
def test_named_path_is_staged_by_the_package_build(path: str) -> None:
    """Each file a message names is installed by packaging/build.py (docs from docs/, the rest by exact path)."""
    if path.startswith("/usr/share/doc/gpuguard/"):
        name = path.rsplit("/", 1)[1]
        assert (REPO / "docs" / name).is_file() and f'"{name}"' in BUILD
    else:
        assert f'"{path}"' in BUILD
