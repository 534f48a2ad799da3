"""A staged rollout over a simulated fleet, in process, on the hub's own store (SQLite in a temp dir): what one stage
decision costs, what one host's bundle fetch decision costs, and how long from a canary's failing report to the
halt being what every host is told.

--hosts hosts in --cohorts cohorts (GPU models) report serial 1; bundles 1 and 2 are pushed; a rollout of 2 starts
(--canaries per cohort, 25 by default so every cohort is judged against its control, issue #43; batches 5,25,100,
no soak). The canaries then report a pass and the rollout widens stage by
stage (each stage's hosts pass at once); the bench times each ``evaluate`` (the locked transaction: read the hosts
and their evidence, decide, write) and the process CPU it took. Then a second rollout's canaries of one cohort
report cpu_fallback, and the bench times the report's ingest plus the next ``evaluate`` (the worker's nudge runs
it within about a second in a hub; here it is called directly) plus one ``offer`` for a held-back host, which then
carries the halt. At the last stage, before its last host reports, it also times an evaluation when nothing
changed since the last one and one after each of --changed (a comma-separated list) hosts reported again (issue
#43: an evaluation should cost what changed). Finally it times ``offer`` (what ``GET /v1/policy/bundle`` asks the
store) for --fetches random hosts.

--code DIR runs the same measurements against the agent code in DIR (e.g. an older commit: ``git archive``);
--before DIR runs them first against DIR, then against this checkout, so both sets of figures come from one run.

Run (under a minute at 10,000 hosts):
    .venv/bin/python bench/bench_rollout.py --hosts 10000
    mkdir /tmp/main && git archive main | tar -x -C /tmp/main
    .venv/bin/python bench/bench_rollout.py --hosts 50000 --changed 100,1000,10000 --before /tmp/main
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Tuple


def _code_root() -> str:
    """The checkout whose agent code is measured: --code DIR, else this one."""
    if "--code" in sys.argv[:-1]:
        return str(Path(sys.argv[sys.argv.index("--code") + 1]).resolve())
    return str(Path(__file__).resolve().parents[1])


sys.path.insert(0, _code_root())

from agent.hub.bundles import PolicyBundles  # noqa: E402
from agent.hub.rollout_plan import RolloutSpec  # noqa: E402
from agent.hub.rollouts import Rollouts  # noqa: E402
from agent.hub.store import SQLiteStore  # noqa: E402
from agent.hub.tokens import Principal  # noqa: E402
from agent.report.events import Event, Heartbeat  # noqa: E402
from tests.hub.factories import ROCM_62, event  # noqa: E402
from tests.hub.signing import check, signature_of  # noqa: E402
from tests.hub.test_policy_bundles import bundle_bytes  # noqa: E402

ADMIN = Principal(role="admin", subject="bench")


def beat(host_id: str, cohort: int, at: dt.datetime, serial: int, health: str) -> Event:
    pairing = ROCM_62.model_copy(update={"gpu_models": f"GPU model {cohort}"})
    return event(host_id, at=at).model_copy(update={"payload": Heartbeat(
        agent_version="1.0", uptime_seconds=1.0, pairing=pairing, policy_source="bundle", policy_serial=serial,
        last_health_status=health)})


def timed_evaluate(rollouts: Rollouts, rid: str) -> Tuple[str, float, float]:
    """One ``evaluate``: its action, wall and CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    decision = rollouts.evaluate(rid)
    assert decision is not None
    return decision.action, time.perf_counter() - wall, time.process_time() - cpu


def changed_cost(rollouts: Rollouts, rid: str, admitted: List[str], report: Callable[[List[str], int, str], None],
                 changed: List[int]) -> None:
    """With every host admitted and one still waiting (so the rollout stays open), what an evaluation costs when
    nothing changed since the last one and when each of ``changed`` hosts reported again (issue #43: it should cost
    what changed, not the whole fleet)."""
    waiting = next(h.host_id for h in rollouts.status(rid).hosts if h.evidence is None or h.evidence.result != "pass")
    others = [h for h in admitted if h != waiting]
    report(others, 2, "pass")  # ``waiting`` has not reported yet: the rollout waits for it
    action, _, cpu_all = timed_evaluate(rollouts, rid)
    assert action == "wait", action
    report([], 2, "pass")  # a tick later, nothing reported: this one still judges the reports of the last tick
    timed_evaluate(rollouts, rid)  # (within INCREMENTAL_MARGIN_SECONDS of the last evaluation) again
    report([], 2, "pass")
    action, _, cpu_none = timed_evaluate(rollouts, rid)
    assert action == "wait", action
    print(f"  evaluate with {len(admitted):>6} admitted, 1 waiting: {cpu_all * 1000:7.1f} ms CPU; again, nothing "
          f"changed: {cpu_none * 1000:7.1f} ms CPU")
    for count in changed:
        report(random.Random(43).sample(others, min(count, len(others))), 2, "pass")
        action, _, cpu_some = timed_evaluate(rollouts, rid)
        assert action == "wait", action
        print(f"  evaluate after {count:>6} hosts reported: {cpu_some * 1000:7.1f} ms CPU "
              f"({(cpu_some - cpu_none) / count * 1000:.3f} ms per changed host above nothing changed)")
        report([], 2, "pass")  # the next evaluation still reads them (the margin): not timed
        timed_evaluate(rollouts, rid)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=10000)
    parser.add_argument("--cohorts", type=int, default=8)
    parser.add_argument("--canaries", type=int, default=25)
    parser.add_argument("--fetches", type=int, default=2000)
    parser.add_argument("--changed", default="100", help="hosts that report again between two evaluations "
                                                           "(comma-separated: one evaluation each)")
    parser.add_argument("--code", help="measure the agent code of this checkout instead of this one")
    parser.add_argument("--before", help="first run the bench against the agent code of this checkout (--code)")
    args = parser.parse_args()
    if args.before:
        argv = [a for i, a in enumerate(sys.argv[1:]) if a != "--before" and sys.argv[i] != "--before"]
        print(f"== before: the agent code of {args.before}", flush=True)
        subprocess.run([sys.executable, __file__, *argv, "--code", args.before], check=True)
        print(f"== after: the agent code of {_code_root()}", flush=True)
    changed = [int(n) for n in args.changed.split(",")]
    hosts = [f"host-{i:06d}" for i in range(args.hosts)]
    cohort_of = {h: i % args.cohorts for i, h in enumerate(hosts)}
    with tempfile.TemporaryDirectory(prefix="gg-rollout-bench-") as tmp:
        store = SQLiteStore(str(Path(tmp) / "hub.db"), synchronous="normal")
        store.open()

        clock = [dt.datetime.now(dt.timezone.utc)]  # the hub's clock: each report arrives one tick (10 s) later

        def report(names: List[str], serial: int, health: str) -> None:
            clock[0] += dt.timedelta(seconds=10)
            at = clock[0]
            for start in range(0, len(names), 2000):
                store.ingest([[beat(h, cohort_of[h], at, serial, health) for h in names[start:start + 2000]]],
                             received_at=at)

        report(hosts, 1, "pass")
        bundles = PolicyBundles(store, check())
        bundles.push(ADMIN, bundle_bytes(1), signature_of(bundle_bytes(1)))
        bundles.push(ADMIN, bundle_bytes(2), signature_of(bundle_bytes(2)))
        # stale_after_seconds as the hub has it (its default)
        rollouts = Rollouts(store, bundles, clock=lambda: clock[0], stale_after_seconds=900.0)
        spec = RolloutSpec(target_serial=2, canaries=args.canaries, batches=(5, 25, 100), soak_seconds=0)
        started = time.perf_counter()
        rid = rollouts.start(ADMIN, spec).rollout.rollout_id
        print(f"hosts {args.hosts}, cohorts {args.cohorts}: start (members, canaries admitted) "
              f"{(time.perf_counter() - started) * 1000:.0f} ms")
        quiet_done = False
        while True:
            admitted = [h.host_id for h in rollouts.status(rid).hosts if h.stage is not None]
            if len(admitted) == args.hosts and not quiet_done:
                quiet_done = True
                changed_cost(rollouts, rid, admitted, report, changed)
            report(admitted, 2, "pass")
            wall, cpu = time.perf_counter(), time.process_time()
            decision = rollouts.evaluate(rid)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            assert decision is not None
            print(f"  evaluate with {len(admitted):>6} admitted: {decision.action:<5} stage {decision.stage} "
                  f"(+{len(decision.admit)} hosts): {wall * 1000:7.1f} ms wall, {cpu * 1000:7.1f} ms CPU")
            if decision.action == "done":
                break
        # A second rollout whose canaries of one cohort fail (the others pass).
        bundles.push(ADMIN, bundle_bytes(3), signature_of(bundle_bytes(3)))
        rid = rollouts.start(ADMIN, spec.model_copy(update={"target_serial": 3})).rollout.rollout_id
        canaries = [h for h in rollouts.status(rid).hosts if h.stage == 0]
        broken = [h.host_id for h in canaries if h.cohort == canaries[0].cohort]
        report([h.host_id for h in canaries if h.host_id not in broken], 3, "pass")
        report([h for h in hosts if h not in {c.host_id for c in canaries}], 1, "pass")  # the control, heard from
        held = next(h.host_id for h in rollouts.status(rid).hosts if h.stage is None)
        failed_at, failed_cpu = time.perf_counter(), time.process_time()
        report(broken, 3, "cpu_fallback")
        decision = rollouts.evaluate(rid)
        offer = rollouts.offer(held)
        elapsed, cpu = time.perf_counter() - failed_at, time.process_time() - failed_cpu
        assert decision is not None and decision.action == "halt" and "halted" in (offer.notice or "")
        print(f"{len(broken)} failing canary reports -> stored, halt decided, a held-back host's offer says halted: "
              f"{elapsed * 1000:.1f} ms wall, {cpu * 1000:.1f} ms CPU (plus up to one min gap, 1 s, in a hub, and "
              f"the host's next poll)\n"
              f"  halt: {decision.reason[:200]}")
        timings = []
        for host in random.sample(hosts, min(args.fetches, len(hosts))):
            t = time.perf_counter()
            rollouts.offer(host)
            timings.append(time.perf_counter() - t)
        timings.sort()
        print(f"offer() for {len(timings)} hosts: p50 {statistics.median(timings) * 1000:.2f} ms, "
              f"p99 {timings[int(len(timings) * 0.99)] * 1000:.2f} ms")
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
