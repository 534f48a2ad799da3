"""The one stdlib-only child of a heartbeat interval: the policy probe, the lean delivery, or both (issue #45).

At the default intervals the policy probe (agent/daemon_jobs/hub_probe.py) and the lean delivery
(agent/daemon_jobs/lean_delivery.py) both run once a minute, and each child was mostly the interpreter's start and
http.client's import. On a heartbeat the resident asks for both parts in this one child (``python -I -S``); at other
times (a delivery after a snapshot's event, a probe without a heartbeat) for one. The request is
``{"probe": HubProbePlan or null, "deliver": LeanDeliveryRequest or null}``; the result
``{"probe": its answer or null, "deliver": its answer or null}``. Each part keeps its own protocol, bounds and
outcomes, runs whatever the other's outcome (the probe first: its GETs are bounded by its deadline), and is imported
only when asked for: a probe alone never loads sqlite3 or the outbox's code. Both parts only transport bytes; the
full children verify.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from agent.daemon_jobs.procstatus import peak_rss_kib

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the lean child's start (issue #45)
    from typing import Dict, Optional, Sequence


def run_parts(request: Dict[str, object]) -> Dict[str, Optional[Dict[str, object]]]:
    """Each part asked for, its answer (as its own module's ``main`` wrote it before the two shared this child)."""
    answers: Dict[str, Optional[Dict[str, object]]] = {"probe": None, "deliver": None}
    plan, delivery = request.get("probe"), request.get("deliver")
    if plan is not None:
        from agent.daemon_jobs.hub_probe import probe_answer

        answers["probe"] = dict(probe_answer(plan))
    if delivery is not None:
        from agent.daemon_jobs.lean_delivery import delivery_answer

        answers["deliver"] = delivery_answer(delivery)
    return answers


def main(argv: Sequence[str]) -> int:
    """``REQUEST_JSON RESULT_PATH``: run the parts, write the result as a job child's reply (protocol.py)."""
    request_json, result_path = argv
    request = json.loads(request_json)
    if not isinstance(request, dict):
        request = {}
    if request.get("deliver") is not None:  # SIGTERM: the batch in flight is finished and marked, no other
        from agent.daemon_jobs.lean_delivery import stop_after_this_batch

        signal.signal(signal.SIGTERM, stop_after_this_batch)
    answers = run_parts(request)
    text = json.dumps({"peak_rss_kib": peak_rss_kib(), "result": answers})
    fd = os.open(result_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return 0


if __name__ == "__main__":  # pragma: no cover - run as ``python -I -S -c`` by lean_argv
    sys.exit(main(sys.argv[1:]))
