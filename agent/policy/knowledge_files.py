"""Which knowledge table is used: the package's copy or the signed bundle's, whichever is dated later.

The package ships each table at /usr/share/gpuguard/knowledge/<table>.toml (policies/knowledge/ in a source tree);
a signed policy bundle in force may carry its own (installed at policy-bundle/knowledge/, agent/statepaths.py).
:func:`choose` (pure) takes the one with the later ``dated``, a tie going to the bundle's, so an old bundle never
rolls the knowledge back behind a newer package; :func:`compiled_table` reads a table's files (bounded, parsed by
agent/policy/knowledge.py) and gives each table's compiled form with its origin (``package`` or ``bundle serial
N``), which ``policy compile`` writes into the compiled policy and ``policy explain``/``status`` name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Tuple

from agent.errors import InputFileError
from agent.files import FileMissing, read_bytes_bounded
from agent.policy.knowledge import (
    MAX_KNOWLEDGE_BYTES,
    KnowledgeInvalid,
    KnowledgeTable,
    file_name,
    parse_knowledge,
)

if TYPE_CHECKING:  # pragma: no cover
    from agent.policy.companions import ExporterTable
    from agent.policy.table_unknown import TheRockTable

# Where the package's tables are looked for, in order: the packaged copy; the packaged copy beside this code's own
# tree (<prefix>/lib/gpuguard/agent -> <prefix>/share/gpuguard/knowledge: a package unpacked under another root, as a
# release-upgrade check or an image build does); then the source tree's.
_CODE_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_KNOWLEDGE_DIRS = ("/usr/share/gpuguard/knowledge",
                          str(_CODE_ROOT.parents[1] / "share" / "gpuguard" / "knowledge"),
                          str(_CODE_ROOT / "policies" / "knowledge"))
PACKAGE_ORIGIN = "package"


@dataclass(frozen=True)
class BundleKnowledge:
    """The knowledge files of the signed bundle in force: their directory and the bundle's serial."""

    directory: str
    serial: int


def parse_named(name: str, data: bytes, where: str) -> KnowledgeTable:
    """A knowledge file's table, which must be the one its name says (``dcgm-exporter.toml`` holds
    ``table = "dcgm-exporter"``); KnowledgeInvalid otherwise."""
    table = parse_knowledge(data, where)
    if file_name(table.table) != name:
        raise KnowledgeInvalid(where, f"table: {table.table!r} is not the table a file named {name} holds")
    return table


def check_carried(knowledge: Optional[Mapping[str, str]]) -> None:
    """Each knowledge file a bundle carries (file name -> TOML text) parsed strictly as the table its name says,
    before anything of the bundle is kept (``policy install``, the daemon's fetch, the hub's push); KnowledgeInvalid
    naming ``knowledge -> FILE`` and the field otherwise."""
    for name, text in sorted((knowledge or {}).items()):
        where = f"knowledge -> {name}"
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise KnowledgeInvalid(where, f"knowledge file is not UTF-8 (character {exc.start})") from None
        parse_named(name, data, where)


def read_table(path: str) -> KnowledgeTable:
    """One knowledge file, read without blocking and bounded; FileMissing, or KnowledgeInvalid naming the file."""
    try:
        data = read_bytes_bounded(path, MAX_KNOWLEDGE_BYTES + 1)
    except FileMissing:
        raise
    except InputFileError as exc:
        raise KnowledgeInvalid(path, exc.reason) from None
    return parse_named(Path(path).name, data, path)


def shipped_table(table: str, directories: Tuple[str, ...] = SHIPPED_KNOWLEDGE_DIRS) -> KnowledgeTable:
    """The package's copy of a table: the first of ``directories`` holding it; KnowledgeInvalid when none does."""
    for directory in directories:
        try:
            return read_table(str(Path(directory) / file_name(table)))
        except FileMissing:
            continue
    raise KnowledgeInvalid(file_name(table), f"gpuguard's {table} table is not found in {', '.join(directories)} "
                                             f"(reinstall gpuguard)")


def choose(shipped: KnowledgeTable, bundled: Optional[KnowledgeTable],
           serial: Optional[int]) -> Tuple[KnowledgeTable, str]:
    """The table to use and its origin: the bundle's when it is dated the same day as the package's or later, else
    the package's (an old bundle never rolls the knowledge back)."""
    if bundled is not None and bundled.dated >= shipped.dated:
        return bundled, f"bundle serial {serial}"
    return shipped, PACKAGE_ORIGIN


def compiled_table(table: str, bundle: Optional[BundleKnowledge] = None,
                   directories: Tuple[str, ...] = SHIPPED_KNOWLEDGE_DIRS) -> Dict[str, Any]:
    """One table in use (one of knowledge.py's TABLES), as the compiled policy holds it (``to_compiled(origin)``);
    KnowledgeInvalid when the package's copy is missing or damaged or the bundle's installed copy is damaged."""
    bundled = None
    if bundle is not None:
        try:
            bundled = read_table(str(Path(bundle.directory) / file_name(table)))
        except FileMissing:
            bundled = None
    chosen, origin = choose(shipped_table(table, directories), bundled, bundle.serial if bundle else None)
    return chosen.to_compiled(origin)


def exporter_table_in_use(bundle: Optional[BundleKnowledge] = None) -> "ExporterTable":
    """The dcgm-exporter table the guard judges with (the snapshot, ``policy check`` and ``policy freeze`` read
    it here, the hook from the compiled policy)."""
    from agent.policy.companions import EXPORTER_TABLE_NAME, exporter_table

    return exporter_table(compiled_table(EXPORTER_TABLE_NAME, bundle))


def therock_table_in_use(bundle: Optional[BundleKnowledge] = None) -> "TheRockTable":
    """The TheRock release table a TheRock release is reported against (the snapshot reads it here, ``policy
    explain`` from the compiled policy)."""
    from agent.policy.table_unknown import THEROCK_RELEASES_TABLE, therock_table

    return therock_table(compiled_table(THEROCK_RELEASES_TABLE, bundle))
