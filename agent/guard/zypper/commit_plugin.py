"""gpuguard's libzypp commit plugin: it keeps each commit's whole transaction for the rpm plugin's hook.

libzypp starts every executable in /usr/lib/zypp/plugins/commit when a commit on ``/`` begins and talks to it in
frames (zypp/doc/autoinclude/Plugin-Commit.doc): ``COMMAND``, ``header:value`` lines, an empty line, a body, a NUL.
This plugin answers ``ACK`` to every frame. On ``COMMITBEGIN`` it writes the step list as the plan of its parent
zypper (agent/guard/zypper/plan.py); on ``COMMITEND``, ``PLUGINEND`` or the end of its input it removes it.

It never vetoes: libzypp unloads a plugin that answers anything but ``ACK`` and commits anyway, so the veto is the
rpm plugin's. A plan it cannot write only makes the hook judge each rpm run by itself (stricter). Standard library
only; bounded: a frame larger than MAX_FRAME_BYTES ends the plugin (the commit goes on, judged per rpm run).
"""

from __future__ import annotations

import os
import sys

from agent.defaults import ZYPPER_PLAN_DIR
from agent.errors import InputFileError
from agent.guard.hotpath.decision import PREFIX
from agent.guard.zypper import plan as zypper_plan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Iterator, Optional, Sequence, TextIO, Tuple

MAX_FRAME_BYTES = 16 << 20
ACK = b"ACK\n\n\x00"


def frames(stream: BinaryIO) -> Iterator[Tuple[str, str]]:
    """(command, body) for each NUL-terminated frame on ``stream``, until it ends or a frame is too large."""
    buffer = b""
    while True:
        while b"\x00" not in buffer:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk or len(buffer) > MAX_FRAME_BYTES:
                return
            buffer += chunk
        raw, _, buffer = buffer.partition(b"\x00")
        text = raw.decode("utf-8", errors="replace").lstrip("\n")
        head, _, body = text.partition("\n\n")
        yield head.split("\n", 1)[0].strip(), body


def serve(stdin: BinaryIO, stdout: BinaryIO, err: TextIO, plan_dir: str, zypper_pid: int,
          proc: str = "/proc") -> int:
    """Answer libzypp until it disconnects; keep the plan while the commit runs."""
    try:
        for command, body in frames(stdin):
            if command == "COMMITBEGIN":
                ticks = zypper_plan.start_ticks(zypper_pid, proc)
                try:
                    if ticks is None:
                        raise InputFileError(f"{proc}/{zypper_pid}/stat", "zypper's start time is unreadable")
                    zypper_plan.write_plan(plan_dir, zypper_pid, ticks, zypper_plan.steps_from_commitbegin(body))
                except (InputFileError, OSError) as exc:
                    err.write(f"{PREFIX}: warning: the zypper commit plugin kept no plan ({exc}); each rpm run is "
                              f"judged by itself\n")
            elif command in ("COMMITEND", "PLUGINEND", "_DISCONNECT"):
                zypper_plan.remove_plan(plan_dir, zypper_pid)
            if command == "_DISCONNECT":
                break
            stdout.write(ACK)
            stdout.flush()
    finally:
        zypper_plan.remove_plan(plan_dir, zypper_pid)
    return 0


def main(argv: Optional[Sequence[str]] = None, stdin: Optional[BinaryIO] = None,
         stdout: Optional[BinaryIO] = None, err: Optional[TextIO] = None) -> int:
    """Plugin entry point (``--plan-dir DIR`` for tests); never raises."""
    stream = err if err is not None else sys.stderr
    args = list(sys.argv[1:] if argv is None else argv)
    plan_dir = args[1] if len(args) == 2 and args[0] == "--plan-dir" else ZYPPER_PLAN_DIR
    try:
        return serve(stdin if stdin is not None else sys.stdin.buffer,
                     stdout if stdout is not None else sys.stdout.buffer, stream, plan_dir, os.getppid())
    except Exception as exc:  # noqa: BLE001 - the plugin cannot veto; a failure only loses the plan
        stream.write(f"{PREFIX}: warning: the zypper commit plugin stopped ({type(exc).__name__}: {exc})\n")
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
