"""Soak: the real agent and the real hub under random SIGKILLs, damaged state files and a full disk.

For ``--seconds`` (90) a random action every 0.5-2 s: append good guard lines, append a hostile guard line,
SIGKILL and restart the agent, SIGKILL and restart the hub, damage ``last-snapshot.json`` while the agent is down,
or fill the agent's state directory (a 16 MiB tmpfs; needs root) for 2-4 s. Then everything is brought up, the
outbox drained, and the counts printed: generated (every sequence the outbox assigned), stored at the hub, still
pending, lost, duplicated, gaps; guard lines written vs stored; damage reports. Goal: lost = duplicated = gaps = 0.
Run: .venv/bin/python bench/soak_damage.py [--seconds 90] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.guard.hotpath.state import append_json_line  # noqa: E402
from agent.hub.tokens import add_token  # noqa: E402
from agent.report.outbox import Outbox  # noqa: E402
from agent.statepaths import StatePaths  # noqa: E402
from tests.conftest import ROOTS, fill_disk  # noqa: E402
from tests.daemon.conftest import AgentProcess, agent_config  # noqa: E402
from tests.hub.process import HubProcess, write_config  # noqa: E402

HOSTILE = [b'{"kind": "override_used", "window": {"id": "w"}, "violations": 5}',
           b'{"kind": "rollback", "x": ' + b"[" * 50000 + b"]" * 50000 + b"}",
           b'{"kind": "transaction_blocked", "tool": "\xff"}', b'{"kind": "rollback", "reason": NaN}']


def hub_rows(db: Path) -> List[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT event_id, sequence, kind, body FROM events WHERE host_id = 'soak-host'").fetchall()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="gpuguard-soak-"))
    small_disk = work / "small-disk"
    small_disk.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(small_disk)], capture_output=True).returncode == 0
    root = work / "root"
    shutil.copytree(ROOTS / "gpuless-debian12", root, symlinks=True)
    hub_dir = work / "hub"
    hub_dir.mkdir()
    config = write_config(hub_dir / "hub.toml", listen_host="127.0.0.1", listen_port=0,
                          database_url=f"sqlite:///{hub_dir}/hub.db", tokens_file=hub_dir / "tokens.json",
                          tokens_reload_seconds=0, shutdown_timeout_seconds=2)
    token_file = work / "token"
    token_file.write_text(add_token(str(hub_dir / "tokens.json"), "host", "soak-host") + "\n")
    os.chmod(token_file, 0o600)
    hub = HubProcess(config).start()
    config.write_text(config.read_text().replace("listen_port = 0", f"listen_port = {hub.port}"))
    agent = AgentProcess(work, root)
    agent.state_dir = small_disk / "state"
    agent.write_config(agent_config(agent.state_dir, hub.url, token_file, log_level="info", batch_size=5)
                       .replace('host_id = "test-host-1"', 'host_id = "soak-host"'))
    events = root / str(agent.state_dir).lstrip("/") / "guard-events.jsonl"
    events.parent.mkdir(parents=True, exist_ok=True)
    counts: Dict[str, int] = {k: 0 for k in ("guard_lines", "hostile_lines", "agent_kills", "hub_kills",
                                             "snapshot_damaged", "disk_full_phases")}
    agent.start()
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.seconds:
            time.sleep(rng.uniform(0.5, 2.0))
            action = rng.choice(["guard", "guard", "hostile", "kill_agent", "kill_hub", "snapshot", "disk_full"])
            if action == "guard":
                for _ in range(rng.randint(1, 5)):
                    counts["guard_lines"] += 1
                    append_json_line(str(events), {
                        "occurred_at": "2026-03-01T12:00:00+00:00", "kind": "transaction_blocked", "tool": "apt",
                        "rule": "soak", "message": f"line {counts['guard_lines']}"})
            elif action == "hostile":
                counts["hostile_lines"] += 1
                with open(events, "ab") as handle:
                    handle.write(rng.choice(HOSTILE) + f' {counts["hostile_lines"]}'.encode() + b"\n")
            elif action == "kill_agent":
                counts["agent_kills"] += 1
                agent.kill()
                agent.start()
            elif action == "kill_hub":
                counts["hub_kills"] += 1
                assert hub.process is not None
                os.kill(hub.process.pid, signal.SIGKILL)
                hub.process.wait(10)
                time.sleep(rng.uniform(0, 1.5))
                hub.start()
            elif action == "snapshot":
                agent.kill()
                try:
                    (agent.state_dir / "last-snapshot.json").write_bytes(rng.choice([b"\xff\xfe", b"[" * 100000]))
                    counts["snapshot_damaged"] += 1
                except OSError:
                    pass  # the disk is full
                agent.start()
            elif action == "disk_full" and mounted:
                counts["disk_full_phases"] += 1
                filler = small_disk / "filler"
                fill_disk(filler)
                time.sleep(rng.uniform(2, 4))
                filler.unlink()
        if agent.proc is None or agent.proc.poll() is not None:
            agent.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            box = Outbox(StatePaths(str(agent.state_dir)).outbox)
            depth = box.depth()
            box.close()
            rows = hub_rows(hub_dir / "hub.db")
            if depth == 0 and sum(1 for r in rows if r[2] == "transaction_blocked") >= counts["guard_lines"]:
                break
            time.sleep(0.5)
        agent.terminate()
        hub.stop()
        box = Outbox(StatePaths(str(agent.state_dir)).outbox)
        generated, pending = box.last_sequence(), [e.sequence for e in box.pending(1000000)]
        rows = hub_rows(hub_dir / "hub.db")
        sequences = [r[1] for r in rows]
        stored = set(sequences)
        accounted = stored | set(pending)
        damaged = [json.loads(r[3])["payload"] for r in rows if r[2] == "state_file_damaged"]
        result = {
            "seconds": args.seconds, "seed": args.seed, "disk_full_phases_possible": mounted, **counts,
            "generated": generated, "stored": len(stored), "pending": len(pending),
            "lost": len(set(range(1, generated + 1)) - accounted),
            "duplicated": len(sequences) - len(stored) + len(stored & set(pending)),
            "gaps": sum(1 for s in range(1, generated + 1) if s not in accounted),
            "guard_lines_stored": sum(1 for r in rows if r[2] == "transaction_blocked"),
            "hostile_lines_reported": sum(1 for d in damaged if d["path"].endswith("guard-events.jsonl")),
            # A damaged copy written over before the agent read it is never seen: compare with what was moved aside.
            "snapshot_moved_aside": len(list(agent.state_dir.glob("last-snapshot.json.damaged-*"))),
            "snapshot_damage_reported": sum(1 for d in damaged if d["path"].endswith("last-snapshot.json")),
            "outbox_damage_reported": sum(1 for d in damaged if d["path"].endswith(StatePaths("").outbox)),
        }
        print(json.dumps(result, indent=2))
        ok = (result["lost"] == result["duplicated"] == result["gaps"] == 0
              and result["guard_lines_stored"] == counts["guard_lines"]
              and result["hostile_lines_reported"] == counts["hostile_lines"]
              and result["snapshot_damage_reported"] == result["snapshot_moved_aside"])
        print("OK" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        agent.cleanup()
        if hub.process is not None and hub.process.poll() is None:
            hub.stop()
        if mounted:
            subprocess.run(["umount", "-l", str(small_disk)], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
