"""agent/log.py: every log line reaches the stream whole, even where several processes share it (the daemon and its
job children share one stderr)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List

import pytest

from agent.log import configure, get_logger

REPO = Path(__file__).resolve().parents[1]


class RecordingRaw(io.RawIOBase):
    """A raw stream that keeps each write(2) it is asked for, as the bytes a file would receive in one call."""

    def __init__(self) -> None:
        self.writes: List[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        chunk = bytes(data)  # type: ignore[call-overload]
        self.writes.append(chunk)
        return len(chunk)


@pytest.fixture
def raw() -> Iterator[RecordingRaw]:
    recording = RecordingRaw()
    yield recording
    configure(level="warning", json_output=True, stream=sys.stderr)  # as tests/conftest.py leaves it


def _log_short_and_long() -> None:
    log = get_logger("test")
    log.warning("short_line", value="x")
    log.warning("long_line", value="y" * 10000)  # longer than TextIOWrapper's 8 KiB chunk


def _assert_one_write_per_line(raw: RecordingRaw) -> None:
    assert [json.loads(chunk)["event"] for chunk in raw.writes] == ["short_line", "long_line"]
    assert all(chunk.endswith(b"\n") and chunk.count(b"\n") == 1 for chunk in raw.writes)


def test_unbuffered_stderr_gets_each_line_and_its_newline_in_one_write(raw: RecordingRaw) -> None:
    """With PYTHONUNBUFFERED (a write-through stderr) a line and its newline are one write, not two."""
    configure(level="info", json_output=True, stream=io.TextIOWrapper(raw, encoding="utf-8", write_through=True))
    _log_short_and_long()
    _assert_one_write_per_line(raw)


def test_line_buffered_stderr_gets_a_line_over_8_kib_in_one_write(raw: RecordingRaw) -> None:
    """Python's default stderr (line-buffered) gets a line longer than its 8 KiB chunk in one write too."""
    buffered = io.BufferedWriter(raw, buffer_size=8192)
    configure(level="info", json_output=True, stream=io.TextIOWrapper(buffered, encoding="utf-8", line_buffering=True))
    _log_short_and_long()
    _assert_one_write_per_line(raw)


_WRITER = """
import sys
from agent.log import configure, get_logger
configure(level="info", json_output=True)
log = get_logger("writer")
for i in range(int(sys.argv[1])):
    log.info("line_written", writer=sys.argv[2], i=i, pad="p" * (i % 300))
"""


def test_processes_sharing_one_unbuffered_stderr_file_never_merge_lines(tmp_path: Path) -> None:
    """Four processes logging at once into one stderr file (as the daemon and its children) leave only whole lines."""
    lines_each, writers = 300, 4
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "shared.log"
    with open(log_path, "wb") as shared:  # one open file description, no O_APPEND: as tests/daemon/conftest.py
        procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(lines_each), str(n)], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=shared)
                 for n in range(writers)]
        try:
            assert [proc.wait(60) for proc in procs] == [0] * writers
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
    unparsed = []
    seen = set()
    for line in log_path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            unparsed.append(line[:200])
            continue
        seen.add((entry["writer"], entry["i"]))
    assert unparsed == [], f"{len(unparsed)} lines do not parse, e.g. {unparsed[:3]}"
    assert seen == {(str(n), i) for n in range(writers) for i in range(lines_each)}


def test_the_cli_error_line_is_one_write(raw: RecordingRaw, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command's (a job child's) ``gpuguard: error:`` line and its newline reach the shared stderr in one write."""
    from agent.cli import main

    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(raw, encoding="utf-8", write_through=True))
    assert main(["_job", "config", "--request", "[]", "--result", "/nonexistent/result.json"],
                make_host=lambda root: None) == 2  # type: ignore[arg-type,return-value]
    assert raw.writes == [b"gpuguard: error: --request must be a JSON object\n"]
