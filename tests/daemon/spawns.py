"""A recorder of the command lines the children seam builds (agent/daemon_jobs/children.py): each builder returns
the real argv and notes which child started, so a test counts full, lean and probe children."""

from __future__ import annotations

from typing import List, Sequence

from agent.daemon_jobs.children import child_argv, lean_argv


class Spawns:
    """The command lines of a job in children (full; lean: a delivery or a policy probe), recorded as they start."""

    def __init__(self) -> None:
        self.started: List[str] = []

    def full(self, job: str, config: str, root: str, request: str, result: str) -> Sequence[str]:
        self.started.append("full")
        return child_argv(job, config, root, request, result)

    def lean(self, job: str, config: str, root: str, request: str, result: str) -> Sequence[str]:
        self.started.append("lean")
        return lean_argv(job, config, root, request, result)

    def probe(self, job: str, config: str, root: str, request: str, result: str) -> Sequence[str]:
        self.started.append("probe")
        return lean_argv(job, config, root, request, result)

    def since(self, mark: int) -> List[str]:
        """The children started after the first MARK."""
        return self.started[mark:]
