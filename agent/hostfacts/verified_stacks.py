"""The hub's verified stacks, cached on the host: per registered workload, the driver and ROCm/CUDA stacks on which
a check of it passed somewhere in the fleet (``workloads-verified.json`` in the state directory, written from the
hub's ``GET /v1/workloads/verified`` by the daemon's policy fetch, agent/bundle/verified.py).

The ``[workloads]`` rule family reads it on the apt/dnf hook's path, so it is parsed strictly and bounded here:

    {"format": 1, "fetched_at": "2026-12-06T19:00:00Z",
     "workloads": {"resnet-train": [{"driver": "nvidia 580.159.04", "gpu_stack": "CUDA 13.0"}, ...], ...}}

bounded by agent/wire.py (MAX_VERIFIED_BYTES, MAX_VERIFIED_WORKLOADS workloads of MAX_VERIFIED_STACKS stacks,
names as ``workload_name_ok``, texts of at most MAX_STACK_TEXT_CHARS), no unknown or repeated key. What cannot be
read is not an error here: :func:`read_verified_stacks` gives None for no file and a :class:`VerifiedStacks`
whose ``problem`` says why for a damaged one, and the family refuses a driver/ROCm/CUDA change in both cases
(fail closed).

Standard library only: the apt hook imports it.
"""

from __future__ import annotations

from agent.records import Record
from agent.wire import (
    MAX_STACK_TEXT_CHARS,
    MAX_VERIFIED_BYTES,
    MAX_VERIFIED_STACKS,
    MAX_VERIFIED_WORKLOADS,
    VERIFIED_FORMAT,
    workload_name_ok,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Optional, Tuple

_STACK_KEYS = ("driver", "gpu_stack")


class VerifiedStack(Record):
    """A stack a workload passed on: its driver (``nvidia 580.159.04``, ``amdgpu 6.10.5``) and ROCm/CUDA
    (``ROCm 6.3.1``, ``CUDA 13.0``) as the health check's stack names them; None where the host had none."""

    __slots__ = ("driver", "gpu_stack")
    driver: Optional[str]
    gpu_stack: Optional[str]

    def __init__(self, driver: Optional[str], gpu_stack: Optional[str]) -> None:
        Record.__init__(self, driver, gpu_stack)

    def describe(self) -> str:
        return f"driver {self.driver or '?'}, {self.gpu_stack or 'no ROCm/CUDA'}"


class VerifiedStacks(Record):
    """The cached list: ``(workload, its verified stacks)`` by name; ``problem`` (None: read) says why the file
    could not be used (missing, damaged), and then nothing counts as verified."""

    __slots__ = ("workloads", "fetched_at", "problem")
    workloads: Tuple[Tuple[str, Tuple[VerifiedStack, ...]], ...]
    fetched_at: Optional[str]
    problem: Optional[str]

    def __init__(self, workloads: Tuple[Tuple[str, Tuple[VerifiedStack, ...]], ...] = (),
                 fetched_at: Optional[str] = None, problem: Optional[str] = None) -> None:
        Record.__init__(self, tuple(sorted(workloads)), fetched_at, problem)

    def stacks_of(self, workload: str) -> Tuple[VerifiedStack, ...]:
        for name, stacks in self.workloads:
            if name == workload:
                return stacks
        return ()


def _text(value: object, where: str) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_STACK_TEXT_CHARS:
        raise ValueError(f"{where}: a string of at most {MAX_STACK_TEXT_CHARS} characters or null")
    return value


def parse_verified_stacks(data: object) -> VerifiedStacks:
    """The list from the file's JSON value; ValueError naming the first bad field (``workloads -> x -> 2 ->
    driver: ...``)."""
    if not isinstance(data, dict) or set(data) != {"format", "fetched_at", "workloads"}:
        raise ValueError("an object with exactly format, fetched_at and workloads")
    if data["format"] != VERIFIED_FORMAT or isinstance(data["format"], bool):
        raise ValueError(f"format: {VERIFIED_FORMAT} expected")
    fetched_at = _text(data["fetched_at"], "fetched_at")
    workloads = data["workloads"]
    if not isinstance(workloads, dict) or len(workloads) > MAX_VERIFIED_WORKLOADS:
        raise ValueError(f"workloads: an object of at most {MAX_VERIFIED_WORKLOADS} workloads")
    found = []
    for name, stacks in workloads.items():
        if not workload_name_ok(name):
            raise ValueError(f"workloads -> {name[:80]!r}: not a workload name")
        if not isinstance(stacks, list) or len(stacks) > MAX_VERIFIED_STACKS:
            raise ValueError(f"workloads -> {name}: a list of at most {MAX_VERIFIED_STACKS} stacks")
        parsed = []
        for index, stack in enumerate(stacks, 1):
            where = f"workloads -> {name} -> {index}"
            if not isinstance(stack, dict) or set(stack) != set(_STACK_KEYS):
                raise ValueError(f"{where}: an object with exactly driver and gpu_stack")
            parsed.append(VerifiedStack(_text(stack["driver"], f"{where} -> driver"),
                                        _text(stack["gpu_stack"], f"{where} -> gpu_stack")))
        found.append((name, tuple(parsed)))
    return VerifiedStacks(tuple(found), fetched_at)


def read_verified_stacks(root: str, path: str) -> Optional[VerifiedStacks]:
    """The list cached at ``path`` (a host path) under ``root``; None when there is none; never raises: an
    unreadable or damaged file gives an empty list with its ``problem``."""
    from agent.errors import InputFileError
    from agent.hostfacts.paths import read_regular_file, under
    from agent.strictjson import parse_json_text

    where = under(root, path)
    try:
        raw = read_regular_file(where, MAX_VERIFIED_BYTES)  # never blocks on a FIFO in its place
    except FileNotFoundError:
        return None
    except OSError as exc:
        return VerifiedStacks(problem=f"{path}: {exc.strerror or exc}")
    try:
        data = parse_json_text(where, raw.decode("utf-8"), unique_keys=True)
    except UnicodeDecodeError as exc:
        return VerifiedStacks(problem=f"{path}: not UTF-8 text (byte {exc.start})")
    except InputFileError as exc:
        return VerifiedStacks(problem=f"{path}: {exc.reason}")
    try:
        return parse_verified_stacks(data)
    except ValueError as exc:
        return VerifiedStacks(problem=f"{path}: {exc}")
