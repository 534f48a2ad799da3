"""Kubernetes' side of the maintenance hand-off: a node-feature-discovery label that says the node is changing.

``begin`` writes ``features.d/gpuguard-maintenance`` beside the daemon's own labels file::

    gpuguard.io/maintenance=true
    gpuguard.io/maintenance-reason=rollout_r43-1a2b3c_stage_2
    gpuguard.io/maintenance-rollout=r43-1a2b3c
    gpuguard.io/maintenance-since=20261204T230000Z

(``maintenance-rollout`` only for a hold a staged rollout's admission began: the hold's typed ``rollout_id``,
agent/integrations/hold.py; never read from the reason, which is text for people.)

``keep`` adds ``gpuguard.io/maintenance-failed=<why>`` (a failed post-change check); ``end`` removes the file.
The file has no expiry line on purpose: a node whose agent died mid-change stays marked until someone looks.

A label cannot cordon a node by itself: NFD only labels. An operator's scheduling policy (a ``NotIn`` node
affinity on ``gpuguard.io/maintenance``, or a taint that a small controller sets from the label) keeps new pods
off, and a controller cordons and drains; docs/integrations.md says how. So ``begin`` is ready at once: there is
nothing gpuguard can wait for on the node itself.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
from typing import Callable, Optional

from agent.errors import StateWriteError
from agent.files import write_atomically
from agent.integrations.handoff import HandoffStep
from agent.integrations.nfd import NAMESPACE, label_time, label_value

MAINTENANCE_FILE_NAME = "gpuguard-maintenance"
MAINTENANCE_LABEL = f"{NAMESPACE}/maintenance"


def maintenance_file(nfd_features_file: str) -> str:
    """The hand-off's features file: beside the daemon's labels file, in the same features.d directory."""
    return os.path.join(os.path.dirname(nfd_features_file) or ".", MAINTENANCE_FILE_NAME)


def reason_id(reason: str) -> str:
    """``reason`` as a label value (``rollout R stage 2`` -> ``rollout_R_stage_2``); ``true`` when nothing is left."""
    return label_value(reason) or "true"


def render_maintenance(reason: str, since_seconds: float, failed: str = "", rollout_id: Optional[str] = None) -> str:
    """The features file of a node under maintenance (``rollout_id``: the rollout that began the hold, None: an
    operator's). Pure."""
    lines = [f"{MAINTENANCE_LABEL}=true", f"{MAINTENANCE_LABEL}-reason={reason_id(reason)}"]
    if rollout_id is not None and label_value(rollout_id):
        lines.append(f"{MAINTENANCE_LABEL}-rollout={label_value(rollout_id)}")
    lines.append(f"{MAINTENANCE_LABEL}-since={label_time(since_seconds)}")
    if failed and label_value(failed):
        lines.append(f"{MAINTENANCE_LABEL}-failed={label_value(failed)}")
    return "\n".join(lines) + "\n"


class KubernetesHandoff:
    """Marks the node through NFD's features.d; never creates the directory (no NFD, no labels)."""

    name = "kubernetes"

    def __init__(self, nfd_features_file: str, clock: Callable[[], dt.datetime], reason: str = "",
                 rollout_id: Optional[str] = None) -> None:
        self.path = maintenance_file(nfd_features_file)
        self._clock = clock
        self._reason = reason  # the hold's reason (kept in the label after a failed check)
        self._rollout_id = rollout_id  # the hold's rollout (None: an operator's)

    def _write(self, text: str) -> None:
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise StateWriteError(self.path, errno.ENOENT,
                                  f"{directory} does not exist: node-feature-discovery is not set up")
        write_atomically(self.path, text)

    def begin(self, reason: str, wait_seconds: float) -> HandoffStep:
        self._reason = reason
        self._write(render_maintenance(reason, self._clock().timestamp(), rollout_id=self._rollout_id))
        return HandoffStep(True, True, f"labelled {MAINTENANCE_LABEL}=true ({reason_id(reason)}) in {self.path}; "
                           "cordoning is the cluster's policy", reason_id(reason))

    def end(self, drained_by_us: bool) -> HandoffStep:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return HandoffStep(drained_by_us, True, "no maintenance label to remove")
        except OSError as exc:
            raise StateWriteError.of(self.path, exc) from None
        return HandoffStep(drained_by_us, True, f"removed {MAINTENANCE_LABEL} ({self.path})")

    def keep(self, drained_by_us: bool, why: str) -> HandoffStep:
        reason = self._reason or why
        self._write(render_maintenance(reason, self._clock().timestamp(), failed=why, rollout_id=self._rollout_id))
        return HandoffStep(True, False, f"kept {MAINTENANCE_LABEL} with {MAINTENANCE_LABEL}-failed: {why}",
                           reason_id(reason))

    def reboot(self, drained_by_us: bool, why: str) -> Optional[HandoffStep]:
        """Kubernetes has no reboot to ask for here (a reboot operator such as kured does that): None."""
        return None
