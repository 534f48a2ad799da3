"""A zypper commit's whole transaction, as libzypp's commit plugin sees it, kept for the rpm plugin's hook.

On SUSE libzypp installs and removes packages one ``rpm`` run at a time (the classic_rpmtrans backend, the builtin
default there), so the rpm plugin's hook sees one package per rpm transaction: a paired move of the AMD driver and
ROCm would look mispaired half way. libzypp's commit plugins cannot veto a commit (libzypp closes a plugin that
answers ``ERROR`` and goes on: zypp/PluginExecutor.cc), but they receive the whole step list first
(``COMMITBEGIN``). gpuguard's commit plugin (agent/guard/zypper/commit_plugin.py) writes it here as a plan::

    {"format": 1, "zypper_pid": 4242, "zypper_start_ticks": 123456,
     "steps": [{"type": "+", "name": "rocm-core", "epoch": "", "version": "6.3.0.60300", "release": "39.sles15",
                "arch": "x86_64"}, ...]}

and the hook judges every rpm run of that zypper (its parent, the same process by its start time) against the
plan: the set the whole commit leaves. A plan that is missing, stale or unreadable is not used; the hook then
judges the rpm transaction by itself, which refuses more, never less. Standard library only.
"""

from __future__ import annotations

import json
import os

from agent.errors import InputFileError
from agent.hostfacts.paths import open_regular, read_regular_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

PLAN_FORMAT = 1
# libzypp's step types (zypp/doc/autoinclude/Plugin-Commit.doc): "+" install, "M" multiversion install (the old
# version stays), "-" remove; a step without a type is implicit (the old side of an upgrade) and carries no change.
STEP_TYPES = ("+", "M", "-")
MAX_PLAN_BYTES = 16 << 20
FIELDS = ("name", "epoch", "version", "release", "arch")


def plan_path(plan_dir: str, zypper_pid: int) -> str:
    return f"{plan_dir}/plan-{zypper_pid}.json"


def start_ticks(pid: int, proc: str = "/proc") -> Optional[int]:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None when it is gone."""
    try:
        stat = read_regular_file(f"{proc}/{pid}/stat", 4096).decode("ascii", errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[19])  # fields after "(comm)" start at field 3
    except (IndexError, ValueError):
        return None


def steps_from_commitbegin(body: str) -> List[Dict[str, str]]:
    """The package steps of a COMMITBEGIN body (``{"TransactionStepList": [...]}``); InputFileError names what is
    wrong. Steps without a type (implicit) are left out."""
    source = "COMMITBEGIN"
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise InputFileError(source, f"not valid JSON ({exc})") from None
    items = doc.get("TransactionStepList") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise InputFileError(source, "TransactionStepList: missing or not a list")
    steps = []
    for index, item in enumerate(items, 1):
        where = f"TransactionStepList -> {index}"
        if not isinstance(item, dict) or not isinstance(item.get("solvable"), dict):
            raise InputFileError(source, f"{where}: no solvable object")
        kind = item.get("type")
        if kind is None:
            continue
        if kind not in STEP_TYPES:
            raise InputFileError(source, f"{where} -> type: {kind!r} is not one of {', '.join(STEP_TYPES)}")
        solvable = item["solvable"]
        step = {"type": kind, "name": solvable.get("n"), "epoch": str(solvable.get("e") or ""),
                "version": solvable.get("v"), "release": solvable.get("r") or "", "arch": solvable.get("a") or ""}
        for key in ("name", "version"):
            if not isinstance(step[key], str) or not step[key]:
                raise InputFileError(source, f"{where} -> solvable -> {key[0]}: missing or not a string")
        steps.append(step)
    return steps


def write_plan(plan_dir: str, zypper_pid: int, ticks: int, steps: List[Dict[str, str]]) -> str:
    """Write the plan (root-only directory and file, replaced atomically); returns its path."""
    from agent.files import write_atomically

    os.makedirs(plan_dir, mode=0o700, exist_ok=True)
    path = plan_path(plan_dir, zypper_pid)
    write_atomically(path, json.dumps({"format": PLAN_FORMAT, "zypper_pid": zypper_pid,
                                       "zypper_start_ticks": ticks, "steps": steps}), mode=0o600)
    return path


def remove_plan(plan_dir: str, zypper_pid: int) -> None:
    try:
        os.unlink(plan_path(plan_dir, zypper_pid))
    except OSError:
        pass


def read_plan(plan_dir: str, zypper_pid: int, proc: str = "/proc") -> Optional[List[Dict[str, str]]]:
    """The steps of the live plan of zypper ``zypper_pid``, or None: no plan, a plan of an earlier process with the
    same pid, one another user could have written, or one that does not parse."""
    try:
        fd, info = open_regular(plan_path(plan_dir, zypper_pid), nofollow=True)
    except OSError:
        return None
    try:
        if info.st_uid != os.geteuid() or info.st_mode & 0o022 or info.st_size > MAX_PLAN_BYTES:
            return None
        data = os.read(fd, MAX_PLAN_BYTES + 1)
    finally:
        os.close(fd)
    try:
        doc: Any = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT or doc.get("zypper_pid") != zypper_pid:
        return None
    ticks = start_ticks(zypper_pid, proc)
    if ticks is None or doc.get("zypper_start_ticks") != ticks:
        return None
    steps = doc.get("steps")
    if not isinstance(steps, list) or not all(isinstance(s, dict) and s.get("type") in STEP_TYPES
                                              and all(isinstance(s.get(k), str) for k in FIELDS) for s in steps):
        return None
    return steps
