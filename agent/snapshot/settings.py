"""``[snapshot]`` of agent.toml: what to watch and how often to snapshot.

``gpuguard snapshot`` validates only this section (``load_snapshot_settings``); the daemon validates the whole file
(agent/config.py), where unknown sections and every other area's mistakes are reported too.
"""

from __future__ import annotations

from typing import List

from pydantic import ConfigDict, Field

from agent.collectors.packages import DEFAULT_WATCHED_PATTERNS
from agent.configfile import parse_toml_model, read_config_text
from agent.defaults import DEFAULT_CONFIG_PATH
from agent.models import FrozenModel


class SnapshotSettings(FrozenModel):
    """What to watch and how often to snapshot."""

    interval_seconds: float = Field(300.0, gt=0)
    watched_packages: List[str] = list(DEFAULT_WATCHED_PATTERNS)
    extra_watched_packages: List[str] = []

    @property
    def all_watched_packages(self) -> List[str]:
        return [*self.watched_packages, *self.extra_watched_packages]


class _SnapshotSection(FrozenModel):
    """agent.toml seen by the snapshot command: its own section checked, the others left to the daemon."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    snapshot: SnapshotSettings = SnapshotSettings()


def load_snapshot_settings(path: str = DEFAULT_CONFIG_PATH, required: bool = False) -> SnapshotSettings:
    """``[snapshot]`` of the config file; defaults when the file does not exist (unless ``required``)."""
    text = read_config_text(path, required)
    if text is None:
        return SnapshotSettings()
    return parse_toml_model(text, path, _SnapshotSection).snapshot
