"""The ROCm tree update-alternatives points at, read off a root: the alternatives database parsed, the links
followed (absolute and relative), and None where no alternative chooses a tree."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import pytest

from agent.hostfacts.alternatives import (
    ActiveTree,
    AlternativeState,
    parse_alternative_state,
    read_active_tree,
    tree_release,
)

# /var/lib/dpkg/alternatives/core after two amdrocm-core<release> postinsts and update-alternatives --set
CORE_STATE = "manual\n/opt/rocm/core\n\n/opt/rocm/core-10.0\n1000\n/opt/rocm/core-7.14\n714\n\n"
# one slave (rocm-bin /opt/rocm/bin): each choice has one slave line after its priority
WITH_SLAVE = ("auto\n/opt/rocm/core\nrocm-bin\n/opt/rocm/bin\n\n/opt/rocm/core-7.14\n714\n/opt/rocm/core-7.14/bin\n"
              "/opt/rocm/core-10.0\n1000\n/opt/rocm/core-10.0/bin\n\n")


@pytest.mark.parametrize("text,expected", [
    (CORE_STATE, AlternativeState("manual", "/opt/rocm/core", (("/opt/rocm/core-10.0", 1000),
                                                               ("/opt/rocm/core-7.14", 714)))),
    (WITH_SLAVE, AlternativeState("auto", "/opt/rocm/core", (("/opt/rocm/core-7.14", 714),
                                                             ("/opt/rocm/core-10.0", 1000)))),
    ("auto\n/opt/rocm/core\n\n", AlternativeState("auto", "/opt/rocm/core", ())),
    ("sometimes\n/opt/rocm/core\n\n", None),
    ("manual\nrelative\n\n", None),
    ("manual\n/opt/rocm/core\n\n/opt/rocm/core-7.14\nhigh\n\n", None),
    ("", None),
])
def test_the_alternatives_database_entry_is_parsed(text: str, expected: Optional[AlternativeState]) -> None:
    """Mode, link and each choice's path and priority, slave lines skipped; anything else is None."""
    assert parse_alternative_state(text) == expected


@pytest.mark.parametrize("path,release", [
    ("/opt/rocm/core-7.14", "7.14"), ("/opt/rocm/core-10.0", "10.0"), ("/opt/rocm-6.4.1", "6.4.1"),
    ("/opt/rocm", None), ("/opt/rocm/core", None), ("/opt/rocm/core-10.0/lib", None), ("/srv/rocm-7.0", None),
])
def test_a_tree_path_names_its_release(path: str, release: Optional[str]) -> None:
    """TheRock's core-X.Y and classic rocm-X.Y.Z trees name their release; other paths none."""
    assert tree_release(path) == release


def _link(root: Path, path: str, target: str) -> None:
    where = root / path.lstrip("/")
    where.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, where)


def test_therock_core_is_read_through_etc_alternatives_with_its_mode_and_choices(tmp_path: Path) -> None:
    """/opt/rocm/core -> /etc/alternatives/core -> /opt/rocm/core-7.14 with dpkg's database: tree, mode, choices."""
    (tmp_path / "opt/rocm/core-7.14").mkdir(parents=True)
    _link(tmp_path, "/opt/rocm/core", "/etc/alternatives/core")
    _link(tmp_path, "/etc/alternatives/core", "/opt/rocm/core-7.14")
    state = tmp_path / "var/lib/dpkg/alternatives/core"
    state.parent.mkdir(parents=True)
    state.write_text(CORE_STATE)
    tree = read_active_tree(str(tmp_path))
    assert tree == ActiveTree("core", "/opt/rocm/core", "/opt/rocm/core-7.14", "manual",
                              ("/opt/rocm/core-10.0", "/opt/rocm/core-7.14"))
    assert tree is not None and tree.release == "7.14"
    assert tree.describe() == "/opt/rocm/core-7.14 (alternative core, manual)"


def test_a_relative_link_and_no_database_entry_still_name_the_tree(tmp_path: Path) -> None:
    """A relative /opt/rocm link into /etc/alternatives (rpm's classic layout) with no database entry: mode ''."""
    _link(tmp_path, "/opt/rocm", "../etc/alternatives/rocm")
    _link(tmp_path, "/etc/alternatives/rocm", "/opt/rocm-7.0.2")
    assert read_active_tree(str(tmp_path)) == ActiveTree("rocm", "/opt/rocm", "/opt/rocm-7.0.2")


def test_no_alternative_is_none(tmp_path: Path) -> None:
    """A plain /opt/rocm link (AMD's classic installer) or no ROCm at all: no alternative chooses the tree."""
    assert read_active_tree(str(tmp_path)) is None
    _link(tmp_path, "/opt/rocm", "/opt/rocm-6.4.1")
    assert read_active_tree(str(tmp_path)) is None


def test_the_rpm_alternatives_database_is_read_where_dpkg_has_none(tmp_path: Path) -> None:
    """On an rpm host the entry is /var/lib/alternatives/<name> (chkconfig's alternatives), in the same format."""
    (tmp_path / "opt/rocm/core-7.14").mkdir(parents=True)
    _link(tmp_path, "/opt/rocm/core", "/etc/alternatives/core")
    _link(tmp_path, "/etc/alternatives/core", "/opt/rocm/core-7.14")
    state = tmp_path / "var/lib/alternatives/core"
    state.parent.mkdir(parents=True)
    state.write_text(CORE_STATE.replace("manual", "auto"))
    tree = read_active_tree(str(tmp_path))
    assert tree is not None and (tree.mode, tree.choices) == ("auto", ("/opt/rocm/core-10.0", "/opt/rocm/core-7.14"))


def test_the_active_tree_is_read_only_where_a_policy_judges_it(tmp_path: Path) -> None:
    """facts_used asks for the active tree under [amd] active_tree = "pinned" (and the amdsmi companion rule),
    not under a plain [amd] section."""
    from agent.hostfacts.context import ACTIVE_TREE
    from agent.policy.evaluate import facts_used
    from agent.policy.load import compiled_from, load_policy

    path = tmp_path / "p.toml"
    plain = '[policy]\nname = "p"\n[amd]\n[[amd.pairing]]\nname = "a"\namdgpu = "any"\nrocm = "any"\n'
    path.write_text(plain)
    assert ACTIVE_TREE not in facts_used(compiled_from(load_policy(str(path))))
    path.write_text(plain.replace("[amd]\n", '[amd]\nactive_tree = "pinned"\n'))
    assert ACTIVE_TREE in facts_used(compiled_from(load_policy(str(path))))
