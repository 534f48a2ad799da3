"""Fall back by repointing: side-by-side ROCm trees switched by update-alternatives, put back without a package.

With TheRock 7.14 and 10.0 installed together, moving between them is ``update-alternatives --set core
/opt/rocm/core-10.0``: no package changes, so the guarded package set alone cannot tell the health gate that the
stack moved, nor say where to go back to. The gate's sets therefore carry the active tree as one more entry,
``alternatives:core -> (/opt/rocm/core-7.14, "tree")`` (:func:`with_trees`): a repoint is a change of the window,
the last set that passed names its tree, and a health rollback whose packages are already that set's puts the tree
back with ``update-alternatives --set`` (:func:`repoint`: no download, no package manager), then the health job
checks again. The Rollback event says ``method = "repoint"``.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

from agent.errors import GpuguardError
from agent.guard.rollback.backend import InstalledPackage
from agent.host import Host
from agent.hostfacts.alternatives import read_active_tree, read_alternative_state
from agent.log import get_logger

log = get_logger("guard.repoint")

TREE_KEY_PREFIX = "alternatives:"  # a gate-set key that is an alternative's tree, not a package
TREE_ARCH = "tree"  # the arch field of such an entry
REPOINT_TIMEOUT_SECONDS = 60.0


def tree_key(name: str) -> str:
    """The gate-set key of the alternative ``name``: ``alternatives:core``."""
    return TREE_KEY_PREFIX + name


def active_trees(host: Host) -> Dict[str, Tuple[str, str]]:
    """The active ROCm tree as gate-set entries (``{"alternatives:core": ("/opt/rocm/core-7.14", "tree")}``);
    empty when no alternative chooses one."""
    chosen = read_active_tree(str(host.root))
    return {} if chosen is None else {tree_key(chosen.name): (chosen.target, TREE_ARCH)}


def with_trees(host: Host, installed: Mapping[str, Tuple[str, str]]) -> Dict[str, Tuple[str, str]]:
    """The guarded packages (key -> (version, arch)) with the active tree added, as the health gate keeps sets."""
    return {**installed, **active_trees(host)}


def split(entries: Mapping[str, InstalledPackage]) -> Tuple[Dict[str, InstalledPackage], Dict[str, str]]:
    """(the packages, {alternative name: tree}) of a set to restore; a tree entry's version is the tree's path."""
    packages = {k: v for k, v in entries.items() if not k.startswith(TREE_KEY_PREFIX)}
    trees = {k[len(TREE_KEY_PREFIX):]: v.version for k, v in entries.items() if k.startswith(TREE_KEY_PREFIX)}
    return packages, trees


def moved_trees(host: Host, wanted: Mapping[str, str]) -> Dict[str, Tuple[str, str]]:
    """{alternative name: (the tree now, the tree wanted)} for each alternative not pointing where ``wanted`` says."""
    now = {k[len(TREE_KEY_PREFIX):]: v[0] for k, v in active_trees(host).items()}
    return {name: (now.get(name, ""), tree) for name, tree in wanted.items() if now.get(name) != tree}


def repoint(host: Host, name: str, tree: str) -> Optional[str]:
    """``update-alternatives --set NAME TREE`` on the host (inside the chroot when the root is not /), then read
    back; None when the alternative points at ``tree`` afterwards, else why not (the tree no longer a choice of
    the alternative, no such directory, the command's failure)."""
    state = read_alternative_state(str(host.root), name)
    if state is not None and tree not in {path for path, _priority in state.choices}:
        return f"{tree} is no longer a choice of the alternative {name}"
    if not host.is_dir(tree):
        return f"{tree} is not a directory on the host"
    tool = "update-alternatives" if host.which("update-alternatives") else "alternatives"
    inner = [tool, "--set", name, tree]
    argv = inner if host.is_live else ["chroot", str(host.root), *inner]
    try:
        ran = host.run(argv, timeout_seconds=REPOINT_TIMEOUT_SECONDS)
    except GpuguardError as exc:
        return f"{tool} --set failed: {exc}"
    if ran.returncode != 0:
        return f"{tool} --set {name} {tree} exited {ran.returncode}: {(ran.stderr or ran.stdout).strip()[:500]}"
    chosen = read_active_tree(str(host.root))
    if chosen is None or chosen.name != name or chosen.target != tree:
        return f"the alternative {name} points at {chosen.target if chosen else 'nothing'} after {tool} --set"
    log.warning("tree_repointed", alternative=name, tree=tree)
    return None
