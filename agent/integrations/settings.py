"""``[integrations]`` settings: which scheduler the maintenance hand-off talks to, and how long it waits."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from agent.models import FrozenModel


class IntegrationsSettings(FrozenModel):
    """The scheduler this node is handed to while it changes (docs/integrations.md, "Maintenance hand-off")."""

    scheduler: Literal["none", "slurm", "kubernetes"] = "none"
    # The Slurm node name; None: $SLURMD_NODENAME, else the short host name.
    slurm_node_name: Optional[str] = Field(None, min_length=1, max_length=255)
    # How long begin waits for the node's jobs to finish (Slurm DRAINING -> DRAINED) before it reports not ready.
    drain_wait_seconds: float = Field(3600.0, ge=0, le=7 * 86400)
    drain_poll_seconds: float = Field(5.0, gt=0, le=600)
