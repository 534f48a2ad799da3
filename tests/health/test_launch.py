"""The probe launcher against hostile fake probes: bounded output, and the whole process tree ended with the probe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.health.launch import OUTPUT_CAP_BYTES, BoundedCapture
from tests.health.helpers import FAKE_PROBE

pytestmark = pytest.mark.slow  # real processes per test: left out of `make test-fast`

REPO = Path(__file__).resolve().parents[2]

# Runs the launcher in a fresh interpreter and reports its peak resident memory before and after the probe.
_DRIVER = """
import json, sys
from agent.health.launch import launch_probe

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

before = hwm()
outcome = launch_probe(sys.argv[1:], {"PATH": "/usr/bin:/bin"}, 120.0)
print(json.dumps({"before": before, "after": hwm(), "stdout": len(outcome.stdout), "stderr": len(outcome.stderr),
                  "too_large": outcome.output_too_large, "returncode": outcome.returncode}))
"""


def test_bounded_capture_keeps_the_head_or_the_tail_and_counts_everything() -> None:
    """A capture keeps at most its cap (the first bytes, or the last with keep_tail) and counts every byte fed."""
    head, tail = BoundedCapture(cap_bytes=4), BoundedCapture(cap_bytes=4, keep_tail=True)
    for chunk in (b"abc", b"defgh", b"ij"):
        head.feed(chunk)
        tail.feed(chunk)
    assert (head.text(), tail.text(), head.total_bytes, head.overflowed) == ("abcd", "ghij", 10, True)


@pytest.mark.timeout(120)
def test_a_flooding_probe_does_not_grow_the_agent() -> None:
    """A probe printing 400 MiB on stdout and stderr leaves the launcher's peak memory within a few MiB of before."""
    argv = [sys.executable, str(FAKE_PROBE), "--mode", "flood", "--flood-mib", "400"]
    done = subprocess.run([sys.executable, "-c", _DRIVER, *argv], capture_output=True, text=True, timeout=110,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["after"] - report["before"] < 32 << 20, report
    assert report["stdout"] <= OUTPUT_CAP_BYTES and report["stderr"] <= OUTPUT_CAP_BYTES
    assert report["returncode"] == 0
    assert f"stderr {400 << 20} bytes > cap" in report["too_large"], report
