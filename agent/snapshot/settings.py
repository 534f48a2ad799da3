"""``[snapshot]`` of agent.toml: what to watch and how often to snapshot.

One declaration, read two ways: ``gpuguard snapshot`` checks only this section, without pydantic
(``load_snapshot_settings``); the daemon's pydantic Settings (agent/config.py) embeds the same frozen record and checks
it with the same rules (agent/configfile.py ``check_section``), where unknown sections and every other area's
mistakes are reported too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List

from agent.configfile import (
    SectionInvalid,
    check_section,
    parse_toml,
    read_config_text,
    section_core_schema,
)
from agent.defaults import DEFAULT_CONFIG_PATH, DEFAULT_WATCHED_PATTERNS
from agent.errors import ConfigError
from agent.frozen import Frozen, field, frozen_record
from agent.validation import validation_problems

if TYPE_CHECKING:  # pragma: no cover
    from pydantic_core import CoreSchema

SECTION = "snapshot"


@frozen_record
class SnapshotSettings(Frozen):
    """What to watch and how often to snapshot."""

    interval_seconds: float = field(default=300.0, metadata={"gt": 0})
    watched_packages: List[str] = field(default_factory=lambda: list(DEFAULT_WATCHED_PATTERNS))
    extra_watched_packages: List[str] = field(default_factory=list)

    @property
    def all_watched_packages(self) -> List[str]:
        return [*self.watched_packages, *self.extra_watched_packages]

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> "CoreSchema":
        return section_core_schema(cls)


def load_snapshot_settings(path: str = DEFAULT_CONFIG_PATH, required: bool = False) -> SnapshotSettings:
    """``[snapshot]`` of the config file; defaults when the file does not exist (unless ``required``).

    The other sections are left to the daemon; ConfigError lists every problem of this one.
    """
    text = read_config_text(path, required)
    if text is None:
        return SnapshotSettings()
    try:
        return check_section(SnapshotSettings, parse_toml(text, path).get(SECTION, {}))
    except SectionInvalid as exc:
        raise ConfigError(path, validation_problems(exc.errors(prefix=(SECTION,)))) from None
