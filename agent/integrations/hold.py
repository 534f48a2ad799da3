"""The maintenance hold as persisted in ``<state_dir>/maintenance.json``: the record, its reader and writers.

Its own module so that readers of the hold (``gpuguard status``, agent/status/) need none of the schedulers:
agent/integrations/maintenance.py begins, polls and ends holds; this file only stores them.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Optional

from agent.errors import InputFileError, StateWriteError
from agent.files import read_json_file, write_atomically
from agent.host import Host
from agent.statepaths import StatePaths
from agent.wire import MAINTENANCE_PHASES, MAX_STATE_FILE_BYTES, rollout_id_ok


@dataclass(frozen=True)
class MaintenanceState:
    """The hold this host has on its node, as persisted."""

    scheduler: str
    node: str
    reason: str
    began_at_seconds: float
    drained_by_us: bool
    # draining (begun, jobs may still run), held (nothing runs), rebooting (Slurm asked to reboot the node),
    # kept (a post-change or post-boot check failed)
    phase: str
    detail: str = ""
    # When the scheduler was first seen with nothing running (Slurm DRAINED); until then the apt hook and dnf
    # checker refuse guarded changes on a Slurm node (agent/guard/hotpath/maintenance.py).
    drained_at_seconds: Optional[float] = None
    # The staged rollout whose admission began the hold (agent/daemon_jobs/handoff.py), written only by gpuguard's
    # own hand-off; None: an operator's hold (gpuguard maintenance begin), also in a file from before the field.
    # Whose hold it is, is read here, never from ``reason`` (text for people).
    rollout_id: Optional[str] = None
    # When the hand-off asked Slurm to reboot the node (phase rebooting; agent/integrations/reboot.py): the gate after
    # the boot judges only health checks that finished after a boot later than this.
    reboot_asked_at_seconds: Optional[float] = None


def state_path(host: Host, paths: StatePaths) -> str:
    return host.file(paths.maintenance)


def read_state(host: Host, paths: StatePaths) -> Optional[MaintenanceState]:
    """The persisted hold, or None; InputFileError naming the file when it is damaged."""
    path = state_path(host, paths)
    data = read_json_file(path, max_bytes=MAX_STATE_FILE_BYTES)
    if data is None:
        return None
    try:
        if not isinstance(data, dict):
            raise TypeError("not an object")
        state = MaintenanceState(**data)
        if not all(isinstance(getattr(state, name), str) for name in ("scheduler", "node", "reason", "phase")) \
                or not isinstance(state.drained_by_us, bool) or state.phase not in MAINTENANCE_PHASES \
                or not isinstance(state.drained_at_seconds, (int, float, type(None))) \
                or isinstance(state.drained_at_seconds, bool) \
                or not isinstance(state.reboot_asked_at_seconds, (int, float, type(None))) \
                or isinstance(state.reboot_asked_at_seconds, bool) \
                or (state.rollout_id is not None and not rollout_id_ok(state.rollout_id)):
            raise TypeError("a field has the wrong type or value")
        return state
    except TypeError as exc:
        raise InputFileError(path, f"not a maintenance record: {exc}") from None


def write_state(host: Host, paths: StatePaths, state: MaintenanceState) -> None:
    write_atomically(state_path(host, paths), json.dumps(asdict(state), sort_keys=True) + "\n")


def clear_state(host: Host, paths: StatePaths) -> None:
    try:
        os.unlink(state_path(host, paths))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise StateWriteError.of(state_path(host, paths), exc) from None
