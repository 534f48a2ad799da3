"""gpuguard's compatibility knowledge as versioned data: the strict parser of one table file (pure, bytes in).

A knowledge file (policies/knowledge/<table>.toml, shipped at /usr/share/gpuguard/knowledge/ and carried by signed
policy bundles) holds one table: its name (``table``), ``version`` (raised at every change), ``dated`` (the day the
whole table was checked against its sources) and its rows, each with its ``source`` (URL or citation) and ``date``
(the day the row was checked). :func:`parse_knowledge` reads the bytes of one file into a typed frozen
:class:`KnowledgeTable`, or raises :class:`KnowledgeInvalid` in one line naming the file and the field; it reads
nothing from disk (agent/policy/knowledge_files.py finds the files and chooses between the package's and a
bundle's). Off the hot path: ``policy compile`` turns the table into plain data for the hook (:meth:`to_compiled`,
read back by agent/policy/companions.py's :func:`~agent.policy.companions.exporter_table`).

Tables (each a model of its own, chosen by the file's ``table``):

- ``dcgm-exporter``: dcgm-exporter release -> the DCGM release it was built with and the series it supports;
- ``therock-releases``: the ROCm release series built with TheRock (packaged as amdrocm-*) -> when each was
  released (read back by agent/policy/table_unknown.py's :func:`~agent.policy.table_unknown.therock_table`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict, List, Literal, Sequence, Tuple, Type

from pydantic import ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator, model_validator

from agent.errors import InputFileError
from agent.models import FrozenModel
from agent.policy.table_unknown import DCGM_EXPORTER, THEROCK_RELEASES_TABLE
from agent.tomlreader import toml_module, toml_worded
from agent.validation import iso_day, validation_problems

# A table is a few kB; past this a file is damaged or hostile and is refused unread (a bundle carries it too).
MAX_KNOWLEDGE_BYTES = 256 * 1024
MAX_ROWS = 2000
MAX_SOURCE_CHARS = 1000
# The tables gpuguard reads, each from the file named after it (``dcgm-exporter.toml``, ``therock-releases.toml``).
TABLES = (DCGM_EXPORTER, THEROCK_RELEASES_TABLE)
FILE_NAMES = tuple(table + ".toml" for table in TABLES)


def file_name(table: str) -> str:
    """The file a table lives in (``dcgm-exporter.toml``), in the package, a bundle and a bundle's install."""
    return table + ".toml"


class KnowledgeInvalid(InputFileError):
    """A knowledge table file is not one: too large, not UTF-8 TOML, or a field is wrong (the message names it)."""


def _three_part(value: str) -> str:
    parts = value.split(".")
    if len(parts) != 3 or not all(p.isdecimal() and p.isascii() for p in parts):
        raise ValueError(f"{value!r} is not a MAJOR.MINOR.PATCH release")
    return value


def _series(value: str) -> str:
    parts = value.split(".")
    if len(parts) != 2 or not all(p.isdecimal() and p.isascii() for p in parts):
        raise ValueError(f"{value!r} is not a MAJOR.MINOR series")
    return value


def release_key(release: str) -> Tuple[int, ...]:
    """A dotted release as numbers, for ordering (``4.10.0`` after ``4.9.0``, ``10.1`` after ``7.14``)."""
    return tuple(int(p) for p in release.split("."))


class KnowledgeModel(FrozenModel):
    """A knowledge table's model: frozen, unknown keys refused, strict (no number for a string)."""

    model_config = ConfigDict(**FrozenModel.model_config, strict=True)


class KnowledgeRow(KnowledgeModel):
    """What every row has: where it is written (``source``) and the day it was checked (``date``); ``KEY`` names
    the field rows are ordered by, one row per value."""

    KEY: ClassVar[str]
    source: StrictStr = Field(min_length=1, max_length=MAX_SOURCE_CHARS)
    date: StrictStr

    _date = field_validator("date")(iso_day)

    def order(self) -> Tuple[int, ...]:
        """The row's key as numbers, for the release order of the table."""
        return release_key(getattr(self, self.KEY))


class ExporterRowModel(KnowledgeRow):
    """One dcgm-exporter release: the DCGM release it was built with, the DCGM series it supports, where that is
    written and the day it was checked."""

    KEY: ClassVar[str] = "exporter"
    exporter: StrictStr
    dcgm: StrictStr
    dcgm_series: List[StrictStr] = Field(min_length=1, max_length=16)

    _releases = field_validator("exporter", "dcgm")(_three_part)

    @field_validator("dcgm_series")
    @classmethod
    def _each_series(cls, value: List[str]) -> List[str]:
        for item in value:
            _series(item)
        return value


def _released(value: str) -> str:
    """A release day, or only its month where the source gives no day (``2026-08-26``, ``2026-05``)."""
    try:
        return iso_day(value)
    except ValueError:
        pass
    try:
        iso_day(value + "-01")
    except ValueError:
        raise ValueError(f"{value!r} is not a day as YYYY-MM-DD or a month as YYYY-MM") from None
    return value


def _url(value: str) -> str:
    if not value.startswith("https://"):
        raise ValueError(f"{value[:60]!r} does not start with the URL of its source (https://...)")
    return value


class TheRockRowModel(KnowledgeRow):
    """One ROCm release series built with TheRock: when it was released (a day, or a month where its source gives
    no day), its source (starting with a URL) and the day the row was checked."""

    KEY: ClassVar[str] = "release"
    release: StrictStr
    released: StrictStr

    _release = field_validator("release")(_series)
    _released = field_validator("released")(_released)
    _source = field_validator("source")(_url)


class KnowledgeTable(KnowledgeModel):
    """One knowledge file: the table's name, version, the day it was checked, and its rows in release order (each
    table a subclass naming its ``table`` and row model)."""

    table: str
    version: StrictInt = Field(ge=1, le=1 << 31)
    dated: StrictStr
    row: Sequence[KnowledgeRow]

    _dated = field_validator("dated")(iso_day)

    @model_validator(mode="after")
    def _rows(self) -> "KnowledgeTable":
        for index, row in enumerate(self.row, 1):
            if row.date > self.dated:
                raise ValueError(f"row -> {index} -> date: {row.date} is after the table's dated {self.dated}")
            before = self.row[index - 2] if index > 1 else None
            if before is not None and row.order() <= before.order():
                raise ValueError(f"row -> {index} -> {row.KEY}: {getattr(row, row.KEY)} is not after the row "
                                 f"before it ({getattr(before, row.KEY)}): rows are one per release, in release "
                                 f"order")
        return self

    def to_compiled(self, origin: str) -> Dict[str, Any]:
        """The table as plain JSON data for the compiled policy, with where it came from (``package``, ``bundle
        serial 7``)."""
        return {"table": self.table, "version": self.version, "dated": self.dated, "origin": origin,
                "rows": [row.model_dump(mode="json") for row in self.row]}


class ExporterTableModel(KnowledgeTable):
    """``dcgm-exporter.toml``."""

    table: Literal["dcgm-exporter"]
    row: List[ExporterRowModel] = Field(min_length=1, max_length=MAX_ROWS)


class TheRockTableModel(KnowledgeTable):
    """``therock-releases.toml``."""

    table: Literal["therock-releases"]
    row: List[TheRockRowModel] = Field(min_length=1, max_length=MAX_ROWS)


# Each table's model, by the name its file gives in ``table`` (the order of TABLES).
MODELS: Dict[str, Type[KnowledgeTable]] = {DCGM_EXPORTER: ExporterTableModel,
                                           THEROCK_RELEASES_TABLE: TheRockTableModel}


def parse_knowledge(data: bytes, where: str) -> KnowledgeTable:
    """The table in ``data`` (a knowledge file's bytes); KnowledgeInvalid in one line naming ``where`` and the field
    otherwise."""
    if len(data) > MAX_KNOWLEDGE_BYTES:
        raise KnowledgeInvalid(where, f"knowledge file is {len(data)} bytes, more than the {MAX_KNOWLEDGE_BYTES} "
                                      f"allowed")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KnowledgeInvalid(where, f"knowledge file is not UTF-8 (byte {exc.start})") from None
    tomllib = toml_module()
    try:
        value = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KnowledgeInvalid(where, f"not valid TOML: {exc}") from None
    except RecursionError:
        raise KnowledgeInvalid(where, "not valid TOML: nested too deeply") from None
    name = value.get("table")
    if name is None:
        raise KnowledgeInvalid(where, "table: Field required")
    model = MODELS.get(name) if isinstance(name, str) else None
    if model is None:
        raise KnowledgeInvalid(where, f"table: Input should be {' or '.join(repr(t) for t in TABLES)}")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise KnowledgeInvalid(where, validation_problems([toml_worded(exc.errors()[0])])[0] + more) from None
