"""AMD GPU targets from the KFD topology (/sys/class/kfd/kfd/topology/nodes/N/properties)."""

from __future__ import annotations

import os

from agent.hostfacts.paths import read_small_text, under

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Dict, List, Optional, Tuple

KFD_NODES_DIR = "/sys/class/kfd/kfd/topology/nodes"


def gfx_target(value: int) -> Optional[str]:
    """KFD's ``gfx_target_version`` as a gfx target: 90402 -> gfx942, 90010 -> gfx90a, 110501 -> gfx1151.

    The number is major*10000 + minor*100 + stepping; minor and stepping are printed in hex, as in ``gfx90a``.
    0 (a CPU node) gives None.
    """
    if value <= 0:
        return None
    major, minor, stepping = value // 10000, (value // 100) % 100, value % 100
    return "gfx{}{:x}{:x}".format(major, minor, stepping)


def parse_kfd_properties(text: str) -> Dict[str, int]:
    """A KFD topology node's ``properties`` file (``name value`` lines, values decimal)."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def read_kfd_nodes(root: str) -> List[Dict[str, int]]:
    """The properties of every KFD topology node, in node order; empty without the topology."""
    base = under(root, KFD_NODES_DIR)
    try:
        nodes = sorted(os.listdir(base), key=lambda n: (len(n), n))
    except OSError:
        return []
    out = []
    for node in nodes:
        text = read_small_text(root, f"{KFD_NODES_DIR}/{node}/properties")
        if text is not None:
            out.append(parse_kfd_properties(text))
    return out


def gpu_targets(root: str) -> Tuple[str, ...]:
    """The distinct gfx targets of the GPUs under ``root``, sorted; empty without a GPU."""
    targets = (gfx_target(node.get("gfx_target_version", 0)) for node in read_kfd_nodes(root))
    return tuple(sorted({t for t in targets if t}))
