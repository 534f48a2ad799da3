"""Versions newer than the newest row of a compatibility table gpuguard judges with: one typed finding for all.

The tables (agent/wire.py's UNKNOWN_TABLES):

- ``amd-matrix``: AMD's compatibility matrix (policies/amd-compat-matrix.toml, its ``recorded`` date): a ROCm
  release series, an amdgpu driver series or a GPU target (gfx) newer than every one the matrix lists;
- ``therock``: the TheRock release table (policies/knowledge/therock-releases.toml, the package's or a signed
  bundle's, whichever is dated later: agent/policy/knowledge_files.py; read back here by :func:`therock_table`): a
  TheRock ROCm release series newer than its newest row;
- ``dcgm-exporter``: the dcgm-exporter table (policies/knowledge/dcgm-exporter.toml, read back by
  agent/policy/companions.py): an exporter, or a DCGM, newer than its newest row.

"Newer" is judged on parsed numbers (``10.10`` is newer than ``10.9``; ``gfx1250`` than ``gfx950``), never on
text. Such a version is reported ("unknown to gpuguard's table dated D": a snapshot finding, a ``status`` line, a
``policy explain`` line, the heartbeat's ``unknown_versions`` and a count at the hub), never refused for being new
and never silently passed. Pure and standard library only (the apt hook imports agent/policy/companions.py).
"""

from __future__ import annotations

from agent.hostfacts.package_keys import package_name
from agent.records import Record
from agent.wire import UNKNOWN_TABLES

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

AMD_MATRIX, THEROCK, DCGM_EXPORTER = UNKNOWN_TABLES
# What each table is called in messages.
TABLE_TITLES = {AMD_MATRIX: "AMD compatibility matrix", THEROCK: "TheRock release table",
                DCGM_EXPORTER: "dcgm-exporter table"}
# The TheRock release table's knowledge file name (``therock-releases.toml``, agent/policy/knowledge.py TABLES); the
# dcgm-exporter table's is its wire name.
THEROCK_RELEASES_TABLE = "therock-releases"


class TheRockTable(Record):
    """The TheRock release table in use: its version, the day it was checked (``dated``), where it came from
    (``package``, ``bundle serial 7``) and its newest release series."""

    __slots__ = ("version", "dated", "origin", "newest")
    version: int
    dated: str
    origin: str
    newest: str

    def __init__(self, version: int, dated: str, origin: str, newest: str) -> None:
        Record.__init__(self, version, dated, origin, newest)

    def named(self) -> str:
        """``TheRock release table version 1 dated 2026-12-06 (from package; newest row: 10.1)`` for people."""
        return (f"{TABLE_TITLES[THEROCK]} version {self.version} dated {self.dated} (from {self.origin}; newest row: "
                f"{self.newest})")


def therock_table(value: Any) -> TheRockTable:
    """The TheRock release table of a compiled policy (agent/policy/knowledge.py ``to_compiled``'s plain data);
    ValueError naming the field when it is misshapen."""
    if not isinstance(value, dict) or value.get("table") != THEROCK_RELEASES_TABLE:
        raise ValueError(f"not the {THEROCK_RELEASES_TABLE} table")
    version = value.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError("version: not a number from 1")
    for field in ("dated", "origin"):
        if not isinstance(value.get(field), str) or not value[field]:
            raise ValueError(f"{field}: not a non-empty string")
    rows = value.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ValueError("rows: not a non-empty list")
    for index, row in enumerate(rows, 1):
        if not isinstance(row, dict) or not release_key(row.get("release")):
            raise ValueError(f"rows -> {index} -> release: not a dotted release")
    return TheRockTable(version, value["dated"], value["origin"], max((r["release"] for r in rows), key=release_key))


class TableUnknown(Record):
    """A version newer than a table's newest row: the table (UNKNOWN_TABLES), the component it is of (agent/wire.py's
    UNKNOWN_COMPONENTS), the version seen, the table's newest row for that component, the table's date, a message
    for people, and the package keys that carry the version (none for a GPU or a tree)."""

    __slots__ = ("table", "component", "version", "newest", "dated", "message", "packages")
    table: str
    component: str
    version: str
    newest: str
    dated: str
    message: str
    packages: Tuple[str, ...]

    def __init__(self, table: str, component: str, version: str, newest: str, dated: str, message: str,
                 packages: Sequence[str] = ()) -> None:
        Record.__init__(self, table, component, version, newest, dated, message, tuple(packages))


def release_key(text: Optional[str]) -> Tuple[int, ...]:
    """The numbers of a dotted release (``10.1`` -> (10, 1)); () for one that is not all digits."""
    parts = (text or "").split(".")
    return tuple(int(p) for p in parts) if all(p.isdecimal() for p in parts) else ()


def newer(release: Optional[str], newest: str) -> bool:
    """Whether a release is newer than a table's newest, compared as numbers (False for one that cannot be read)."""
    key = release_key(release)
    return bool(key) and key > release_key(newest)


def gfx_key(target: Optional[str]) -> Tuple[int, ...]:
    """A gfx target as (major, minor, stepping): ``gfx942`` -> (9, 4, 2), ``gfx1201`` -> (12, 0, 1), ``gfx90a`` ->
    (9, 0, 10); () for anything else."""
    body = (target or "")[3:] if (target or "").startswith("gfx") else ""
    if len(body) < 3 or not body[:-2].isdecimal():
        return ()
    try:
        return int(body[:-2]), int(body[-2], 16), int(body[-1], 16)
    except ValueError:
        return ()


def _newest(values: Sequence[str]) -> Optional[str]:
    readable = [v for v in values if release_key(v)]
    return max(readable, key=release_key) if readable else None


def _where(table: str, dated: str, newest: str) -> str:
    return f"unknown to gpuguard's {TABLE_TITLES[table]} dated {dated} (newest row: {newest})"


def _by_release(found: Mapping[str, Optional[str]]) -> Dict[str, List[str]]:
    """Release -> the keys (package keys, tree paths) that carry it, releases that cannot be read left out."""
    out: Dict[str, List[str]] = {}
    for key, release in sorted(found.items()):
        if release:
            out.setdefault(release, []).append(key)
    return out


def _shown(keys: Sequence[str]) -> str:
    return ", ".join(package_name(k) if not k.startswith("/") else k for k in keys)


def amd_matrix(matrix: Mapping[str, Any], rocm: Mapping[str, Optional[str]], drivers: Mapping[str, Optional[str]],
               gpus: Sequence[str]) -> List[TableUnknown]:
    """ROCm release series (``rocm``: package key or tree -> series), amdgpu driver series (``drivers``: package key
    -> series) and GPU targets newer than every one AMD's matrix (its compiled form, agent/policy/matrix.py
    ``to_compiled``) lists."""
    dated = str(matrix.get("recorded") or "undated")
    rows: Mapping[str, Any] = matrix.get("rocm") or {}
    out = []
    newest_rocm = _newest(list(rows))
    if newest_rocm:
        for release, keys in sorted(_by_release(rocm).items(), key=lambda item: release_key(item[0])):
            if newer(release, newest_rocm):
                where = _where(AMD_MATRIX, dated, "ROCm " + newest_rocm)
                out.append(TableUnknown(AMD_MATRIX, "rocm", release, newest_rocm, dated,
                                        f"ROCm {release} ({_shown(keys)}) is {where}: which drivers, OS releases "
                                        "and GPUs AMD supports it with is not known to gpuguard; update the matrix",
                                        [k for k in keys if not k.startswith("/")]))
    newest_driver = _newest(list(matrix.get("driver_rocm") or {}))
    if newest_driver:
        for release, keys in sorted(_by_release(drivers).items(), key=lambda item: release_key(item[0])):
            if newer(release, newest_driver):
                out.append(TableUnknown(AMD_MATRIX, "amdgpu", release, newest_driver, dated,
                                        f"amdgpu driver {release} ({_shown(keys)}) is "
                                        f"{_where(AMD_MATRIX, dated, 'driver ' + newest_driver)}: which ROCm it "
                                        "supports is not known to gpuguard; update the matrix", keys))
    listed = [g for row in rows.values() for g in (row.get("gpus") or ()) if gfx_key(g)]
    newest_gpu = max(listed, key=gfx_key) if listed else None
    if newest_gpu:
        for target in sorted(set(gpus), key=gfx_key):
            if gfx_key(target) and gfx_key(target) > gfx_key(newest_gpu):
                out.append(TableUnknown(AMD_MATRIX, "gpu", target, newest_gpu, dated,
                                        f"GPU target {target} is {_where(AMD_MATRIX, dated, newest_gpu)}: which ROCm "
                                        "supports it is not known to gpuguard; update the matrix"))
    return out


def compiled_therock_table(knowledge: Any) -> Optional[TheRockTable]:
    """The TheRock release table a compiled policy's ``knowledge`` section holds; None when it holds none (a policy
    compiled before the table was data) or a misshapen one: nothing is then reported against it."""
    try:
        return therock_table(knowledge.get(THEROCK_RELEASES_TABLE)) if isinstance(knowledge, dict) else None
    except ValueError:
        return None


def therock(found: Mapping[str, Optional[str]], table: TheRockTable) -> List[TableUnknown]:
    """TheRock release series (``found``: package key or tree path -> series) newer than the TheRock release table's
    newest row (``table``: the one in use)."""
    dated, newest = table.dated, table.newest
    return [TableUnknown(THEROCK, "therock", release, newest, dated,
                         f"TheRock ROCm {release} ({_shown(keys)}) is {_where(THEROCK, dated, newest)}: not judged "
                         "by what gpuguard knows of TheRock releases; update gpuguard",
                         [k for k in keys if not k.startswith("/")])
            for release, keys in sorted(_by_release(found).items(), key=lambda item: release_key(item[0]))
            if newer(release, newest)]
