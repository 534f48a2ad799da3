"""The maintenance hold's gate: a change to guarded packages waits until Slurm has drained the node.

The daemon begins the hand-off when it installs a new bundle (agent/integrations/maintenance.py writes
``<state_dir>/maintenance.json``) and records the node as drained once ``scontrol`` shows it DRAINED (phase
``held``, ``drained_at_seconds``). Until then jobs still run on the node, so the hook refuses transactions that
touch guarded packages with one line saying what it waits for. Kubernetes holds never wait (the label is enough);
a ``kept`` hold (a failed post-change check) and a ``rebooting`` one (the change is in, the node waits for its
reboot) let changes through, the rollback included. A missing file is no
hold; a damaged one refuses guarded changes (fail closed, as for other damaged state). Standard library only, and
read only when a transaction touches guarded packages.
"""

from __future__ import annotations

from agent.hostfacts.paths import read_regular_file
from agent.printable import printable
from agent.wire import MAINTENANCE_PHASES, MAX_STATE_FILE_BYTES

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Optional, Tuple

MAX_FIELD_CHARS = 200


def _printable(text: str) -> str:
    """One bounded line of ``text`` with control characters escaped (agent/printable.py, the one rule for that)."""
    return " ".join(printable(text[:MAX_FIELD_CHARS]).split())


def drain_wait(path: str) -> Tuple[Optional[str], bool]:
    """What the hold at ``path`` says of a guarded change now: (None, False) when it may go ahead (no hold, a
    drained node, a Kubernetes or kept hold), (the line saying why it waits, False) while Slurm drains, (the line
    saying what is wrong, True) when the file is damaged."""
    try:
        data = read_regular_file(path, MAX_STATE_FILE_BYTES)
    except FileNotFoundError:
        return None, False
    except OSError as exc:  # a FIFO, a directory, too large, unreadable
        return f"{path}: cannot read the maintenance hold ({exc.strerror or exc})", True
    import json  # only when a hold exists: an allowed run without one imports nothing heavy

    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        return f"{path}: the maintenance hold is not JSON ({_printable(str(exc))})", True
    if not isinstance(value, dict) or not all(isinstance(value.get(k), str) for k in ("scheduler", "node", "reason")) \
            or value.get("phase") not in MAINTENANCE_PHASES:
        return f"{path}: not a maintenance record (scheduler, node, reason or phase missing or wrong)", True
    drained_at = value.get("drained_at_seconds")
    if value["scheduler"] != "slurm" or value["phase"] != "draining" or isinstance(drained_at, (int, float)):
        return None, False
    return (f"maintenance for {_printable(value['reason'])}: waiting for Slurm to drain node "
            f"{_printable(value['node'])} (jobs still running); the change will be allowed once it is drained"), False
