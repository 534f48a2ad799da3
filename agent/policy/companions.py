"""Companion pairings: packages that break monitoring or the GPUs when they drift from the package they serve.

- ``companion.fabricmanager``: NVIDIA fabric manager (``nvidia-fabricmanager-580``, ``nvidia-fabricmanager``,
  rpm's ``nvidia-fabric-manager``) and NSCQ (``libnvidia-nscq-580``) must be the exact build of the NVIDIA driver,
  or fabric manager refuses to start and the GPUs of an NVSwitch system stay unusable.
- ``companion.dcgm``: DCGM's packages (``datacenter-gpu-manager-4-core``, ``-4-cuda13``, ``-4-proprietary``, ...)
  of one release: in DCGM 4.7.1, libdcgm and ``nv-hostengine`` of different releases fail with an API version
  mismatch.
- ``companion.dcgm_exporter``: dcgm-exporter within the DCGM release series it was built and tested for
  (gpuguard's dcgm-exporter table, :class:`ExporterTable`, with sources): package versions carry only the
  exporter's own version.
- ``companion.amdsmi``: the amdsmi Python binding and ``libamd_smi.so.N`` of one ROCm release (a binding of another
  release fails at ``import amdsmi``).

Pure judgements over an installed set (key -> version), shared by the evaluator (its companions family,
agent/policy/families/companions.py: the apt hook, the dnf checkers, ``policy explain``, compliance, the rollback
check) and the snapshot's drift findings
(agent/snapshot/drift.py), so a host is judged the same way before and during a transaction. Standard library only
(the apt hook imports it when a policy has a ``[companions]`` section).
"""

from __future__ import annotations

from agent.hostfacts.package_keys import package_name
from agent.policy import releases
from agent.policy.globs import any_glob
from agent.policy.table_unknown import DCGM_EXPORTER as EXPORTER_TABLE_NAME
from agent.policy.table_unknown import TableUnknown
from agent.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

FABRICMANAGER, DCGM, DCGM_EXPORTER, AMDSMI = ("companion.fabricmanager", "companion.dcgm", "companion.dcgm_exporter",
                                              "companion.amdsmi")
# The [companions] fields, in the order the rules are judged and shown; each is the rule id's tail.
RULE_FIELDS: Tuple[str, ...] = ("fabricmanager", "dcgm", "dcgm_exporter", "amdsmi")

# Fabric manager and NSCQ as NVIDIA's packaging templates name them ("the version of fabricmanager must match the
# NVIDIA driver installed", the same of libnvidia-nscq: NVIDIA/yum-packaging-fabric-manager,
# NVIDIA/yum-packaging-libnvidia-nscq, apt-packaging-fabric-manager): nvidia-fabricmanager-580,
# nvidia-fabricmanager-dev-580 / -devel-580, libnvidia-nscq-580, the cuda-drivers-fabricmanager(-580) meta packages,
# versioned 580.95.05-1; and the unversioned names some repositories use (nvidia-fabricmanager,
# nvidia-fabric-manager, libnvidia-nscq: not seen in an index).
FABRICMANAGER_PACKAGES: Tuple[str, ...] = ("nvidia-fabricmanager*", "nvidia-fabric-manager*", "libnvidia-nscq*",
                                           "cuda-drivers-fabricmanager*")
# DCGM 3 (datacenter-gpu-manager) and DCGM 4's split packages (datacenter-gpu-manager-4-core, -4-cuda12, -4-cuda13,
# -4-proprietary, -4-proprietary-cuda13, -4-dev, ...); not the exporter and not DCGM 1's fabric manager.
DCGM_PACKAGES: Tuple[str, ...] = ("datacenter-gpu-manager", "datacenter-gpu-manager-[0-9]*")
# dcgm-exporter as a package: Microsoft's build (dcgm-exporter 4.8.3-ubuntu24.04u5) and the name NVIDIA's
# repositories are expected to use (datacenter-gpu-manager-exporter: not seen in a package index).
DCGM_EXPORTER_PACKAGES: Tuple[str, ...] = ("dcgm-exporter", "datacenter-gpu-manager-exporter")
# The amdsmi Python binding packaged on its own: Debian's amd-smi (module and CLI, beside libamd-smiN) and
# python3-amdsmi. ROCm's amd-smi-lib and TheRock's amdrocm-amdsmi<release> carry binding and library together.
AMDSMI_BINDING_PACKAGES: Tuple[str, ...] = ("amd-smi", "python3-amdsmi")
AMDSMI_LIBRARY_PACKAGES: Tuple[str, ...] = ("libamd-smi[0-9]*", "amd-smi-lib", "amd-smi-lib[0-9]*", "amdrocm-amdsmi*")

# dcgm-exporter release -> the DCGM release it was built with and the DCGM release series it supports: gpuguard's
# dcgm-exporter knowledge table (policies/knowledge/dcgm-exporter.toml, agent/policy/knowledge.py; the package's copy
# or a signed bundle's, whichever is dated later), compiled into the compiled policy and read back by
# :func:`exporter_table`. Package versions carry only the exporter's own version; the pair is in the release tag
# ``<dcgm>-<exporter>``. An exporter release the table does not know cannot be judged: one older than its newest row
# is a violation of the rule (update the table, or turn the rule off); one newer than its newest row (and a DCGM newer
# than the newest row's) is reported as "unknown to gpuguard's table dated D" (:func:`unknown_to_table`: a snapshot
# finding, ``status``, ``policy explain``), never silently passed and never refused for being new. The table's name,
# EXPORTER_TABLE_NAME, is wire's (agent/wire.py UNKNOWN_TABLES), imported above.


class ExporterRow(Record):
    """One row of the dcgm-exporter table: the exporter release, the DCGM release it was built with, the DCGM series
    it supports, its source and the day it was checked."""

    __slots__ = ("exporter", "dcgm", "series", "source", "date")
    exporter: str
    dcgm: str
    series: Tuple[str, ...]
    source: str
    date: str

    def __init__(self, exporter: str, dcgm: str, series: Sequence[str], source: str, date: str) -> None:
        Record.__init__(self, exporter, dcgm, tuple(series), source, date)


class ExporterTable(Record):
    """The dcgm-exporter table in use: its version, the day it was checked (``dated``), where it came from
    (``package``, ``bundle serial 7``) and its rows in release order (the newest last)."""

    __slots__ = ("version", "dated", "origin", "rows")
    version: int
    dated: str
    origin: str
    rows: Tuple[ExporterRow, ...]

    def __init__(self, version: int, dated: str, origin: str, rows: Sequence[ExporterRow]) -> None:
        Record.__init__(self, version, dated, origin, tuple(rows))

    @property
    def newest(self) -> ExporterRow:
        return self.rows[-1]

    def named(self) -> str:
        """``dcgm-exporter table version 2 dated 2026-12-06 (from package)`` for lines people read."""
        return (f"{EXPORTER_TABLE_NAME} table version {self.version} dated {self.dated} (from {self.origin}; newest "
                f"row: exporter {self.newest.exporter} with DCGM {self.newest.dcgm})")


def exporter_table(value: Any) -> ExporterTable:
    """The dcgm-exporter table of a compiled policy (KnowledgeTable.to_compiled's plain data); ValueError naming
    the field when it is misshapen (the compiled policy's check turns that into its one-line error)."""
    def text(item: Any, where: str) -> str:
        if not isinstance(item, str) or not item:
            raise ValueError(f"{where}: not a non-empty string")
        return item

    if not isinstance(value, dict) or value.get("table") != EXPORTER_TABLE_NAME:
        raise ValueError(f"not the {EXPORTER_TABLE_NAME} table")
    version = value.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError("version: not a number from 1")
    rows = value.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ValueError("rows: not a non-empty list")
    out = []
    for index, row in enumerate(rows, 1):
        where = f"rows -> {index}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: not an object")
        series = row.get("dcgm_series")
        if not isinstance(series, list) or not series:
            raise ValueError(f"{where} -> dcgm_series: not a non-empty list")
        exporter, dcgm = text(row.get("exporter"), where + " -> exporter"), text(row.get("dcgm"), where + " -> dcgm")
        source, date = text(row.get("source"), where + " -> source"), text(row.get("date"), where + " -> date")
        out.append(ExporterRow(exporter, dcgm, [text(s, where + " -> dcgm_series") for s in series], source, date))
        if not _three_part(out[-1].exporter) or not _three_part(out[-1].dcgm):
            raise ValueError(f"{where}: exporter and dcgm are not MAJOR.MINOR.PATCH releases")
    return ExporterTable(version, text(value.get("dated"), "dated"), text(value.get("origin"), "origin"), out)


# What each rule asks, as ``policy explain`` shows it.
DESCRIPTIONS = {
    FABRICMANAGER: "fabric manager and libnvidia-nscq must be the NVIDIA driver's exact build",
    DCGM: "DCGM's packages must be one release (libdcgm and nv-hostengine)",
    DCGM_EXPORTER: "dcgm-exporter must run with a DCGM of the series it was built for",
    AMDSMI: "the amdsmi Python binding and libamd_smi must be of one ROCm release",
}
HINTS = {
    FABRICMANAGER: "move fabric manager (and libnvidia-nscq) with the driver to the same build in one transaction",
    DCGM: "move every DCGM package to one release in one transaction",
    DCGM_EXPORTER: "move dcgm-exporter and DCGM together to a pairing NVIDIA tested",
    AMDSMI: "install the amdsmi binding of the ROCm release whose libamd_smi is installed (or the reverse)",
}


class Disagreement(Record):
    """One companion rule a set breaks: the rule id, a message naming both sides, and the package keys of both
    sides (the judged ones; the caller adds what moved)."""

    __slots__ = ("rule", "message", "packages")
    rule: str
    message: str
    packages: Tuple[str, ...]

    def __init__(self, rule: str, message: str, packages: Sequence[str]) -> None:
        Record.__init__(self, rule, message, tuple(packages))


def family(rule: str, driver_patterns: Sequence[str] = ()) -> Tuple[str, ...]:
    """The package globs a rule reads (the NVIDIA driver's for fabric manager), as names and ``prefix*`` only (the
    apt hook looks those up without scanning every stanza): what a policy with the rule must guard, so the hook
    sees them, and whose moves a disagreement is caused by."""
    if rule == FABRICMANAGER:
        return FABRICMANAGER_PACKAGES + tuple(driver_patterns)
    if rule == DCGM:
        return ("datacenter-gpu-manager*",)
    if rule == DCGM_EXPORTER:
        return DCGM_EXPORTER_PACKAGES + ("datacenter-gpu-manager*",)
    return ("amd-smi*", "python3-amdsmi*", "libamd-smi*", "amdrocm-amdsmi*")


def _keys(installed: Mapping[str, str], patterns: Sequence[str]) -> List[str]:
    match = any_glob(patterns)
    return sorted(k for k in installed if match(package_name(k)))


def _grouped(found: Mapping[str, str], limit: int = 3) -> str:
    """``580.105.08 (libnvidia-compute-580, nvidia-driver-580-open and 4 more)`` for messages."""
    by_release: Dict[str, List[str]] = {}
    for key, release in sorted(found.items()):
        by_release.setdefault(release, []).append(package_name(key))
    parts = []
    for release, names in sorted(by_release.items()):
        cut = limit if len(names) > limit + 1 else len(names)  # "and 1 more" says less than the name
        shown = ", ".join(names[:cut]) + (f" and {len(names) - cut} more" if len(names) > cut else "")
        parts.append(f"{release} ({shown})")
    return ", ".join(parts)


def _release(version: str) -> str:
    return releases.dotted_release(version) or "unknown"


# --- fabric manager x the NVIDIA driver ------------------------------------------------------------------------


def fabricmanager(installed: Mapping[str, str], driver_patterns: Sequence[str], loaded_module: Optional[str],
                  not_driver: Sequence[str] = (), leaves: str = "the host has") -> List[Disagreement]:
    """Fabric manager and NSCQ at a build other than the NVIDIA driver's (every driver part present, else the
    loaded module; none at all is a disagreement too). ``leaves`` words the driver's side (``the transaction
    leaves``)."""
    fm = {k: _release(installed[k]) for k in _keys(installed, FABRICMANAGER_PACKAGES)}
    if not fm:
        return []
    companion = any_glob(FABRICMANAGER_PACKAGES)
    driver = {k: _release(installed[k]) for k in _keys(installed, driver_patterns)
              if not companion(package_name(k)) and package_name(k) not in not_driver}
    if driver:
        driver_text = f"driver {_grouped(driver)}"
        driver_releases = set(driver.values())
    elif loaded_module:
        driver_text = f"driver {loaded_module} (the loaded nvidia module; no driver package)"
        driver_releases = {loaded_module}
    else:
        driver_text = "no NVIDIA driver (no driver package, no loaded nvidia module)"
        driver_releases = set()
    out = []
    for key, release in sorted(fm.items()):
        if driver_releases == {release}:
            continue
        others = sorted(k for k, r in driver.items() if r != release)
        out.append(Disagreement(FABRICMANAGER, f"{package_name(key)} {release} needs driver {release}; {leaves} "
                                               f"{driver_text}", [key, *others]))
    return out


# --- DCGM's packages of one release ----------------------------------------------------------------------------


def dcgm(installed: Mapping[str, str]) -> List[Disagreement]:
    """DCGM's packages at more than one release (libdcgm and nv-hostengine must be one release)."""
    found = {k: releases.dotted_release(installed[k], parts=3) or "unknown" for k in _keys(installed, DCGM_PACKAGES)}
    if len(set(found.values())) < 2:
        return []
    return [Disagreement(DCGM, f"DCGM's packages are not one release: {_grouped(found)}; libdcgm and "
                               f"nv-hostengine of different releases fail with 'API version mismatch'", sorted(found))]


# --- dcgm-exporter x DCGM --------------------------------------------------------------------------------------


def exporter_pairing(version: str, table: ExporterTable) -> Optional[Tuple[str, str, Tuple[str, ...], str]]:
    """(exporter release, DCGM release it was built with, DCGM series it supports, source) of a dcgm-exporter
    package version, or None when unknown. A version in the release tag's form (``4.5.2-4.8.1``, as some
    repackagings write it) carries the pair itself; otherwise ``table`` says."""
    text = version.split(":", 1)[1] if ":" in version.split("-", 1)[0] else version
    head = text.split("-")
    if len(head) >= 2 and all(_three_part(p) for p in head[:2]):
        return head[1], head[0], (releases.series(head[0]) or head[0],), "the package version (<dcgm>-<exporter>)"
    release = releases.dotted_release(text, parts=3)
    for row in table.rows:
        if row.exporter == release:
            return row.exporter, row.dcgm, row.series, row.source
    return None


def _three_part(text: str) -> bool:
    parts = text.split(".")
    return len(parts) == 3 and all(p.isdecimal() for p in parts)


def _numbers(release: Optional[str]) -> Tuple[int, ...]:
    return tuple(int(p) for p in release.split(".")) if release and _three_part(release) else ()


def _newer_than_table(release: Optional[str], newest: str) -> bool:
    """Whether a three-part release is newer than the table's newest (False for one that cannot be read)."""
    return bool(_numbers(release)) and _numbers(release) > _numbers(newest)


def unknown_to_table(installed: Mapping[str, str], table: ExporterTable) -> List[TableUnknown]:
    """dcgm-exporter releases newer than ``table``'s newest row (and not carrying their DCGM pair in their
    version), and DCGM packages of a release newer than the newest row's DCGM: what gpuguard's table cannot judge
    yet."""
    newest_exporter, newest_dcgm = table.newest.exporter, table.newest.dcgm
    where = (f"unknown to gpuguard's dcgm-exporter table dated {table.dated} (from {table.origin}; newest row: "
             f"exporter {newest_exporter} with DCGM {newest_dcgm})")
    out = []
    for key in _keys(installed, DCGM_EXPORTER_PACKAGES):
        version = installed[key]
        release = releases.dotted_release(version, parts=3)
        if exporter_pairing(version, table) is None and _newer_than_table(release, newest_exporter):
            out.append(TableUnknown(EXPORTER_TABLE_NAME, "dcgm-exporter", release or version, newest_exporter,
                                    table.dated, f"{package_name(key)} {version} is {where}: which DCGM it "
                                    "supports is not judged; update gpuguard", [key]))
    dcgm = {k: releases.dotted_release(installed[k], parts=3) or "unknown" for k in _keys(installed, DCGM_PACKAGES)}
    newer = {k: r for k, r in dcgm.items() if _newer_than_table(r, newest_dcgm)}
    if newer:
        out.append(TableUnknown(EXPORTER_TABLE_NAME, "dcgm", max(newer.values(), key=_numbers), newest_dcgm,
                                table.dated, f"DCGM {_grouped(newer, 2)} is {where}: which dcgm-exporter it "
                                "takes is not judged; update gpuguard", sorted(newer)))
    return out


def dcgm_exporter(installed: Mapping[str, str], table: ExporterTable) -> List[Disagreement]:
    """dcgm-exporter with a DCGM outside the release series its release was built for (or no DCGM, or a release
    older than the table's newest that the table does not know; one newer than its newest row is
    :func:`unknown_to_table`'s, not a disagreement)."""
    exporters = _keys(installed, DCGM_EXPORTER_PACKAGES)
    if not exporters:
        return []
    found = {k: releases.dotted_release(installed[k], parts=3) or "unknown" for k in _keys(installed, DCGM_PACKAGES)}
    dcgm_text = f"DCGM {_grouped(found, 2)}" if found else "no DCGM package"
    out = []
    for key in exporters:
        version = installed[key]
        pairing = exporter_pairing(version, table)
        if pairing is None:
            if not _newer_than_table(releases.dotted_release(version, parts=3), table.newest.exporter):
                out.append(Disagreement(DCGM_EXPORTER, f"{package_name(key)} {version} is not in gpuguard's "
                                                       f"dcgm-exporter table (dated {table.dated}): which "
                                                       f"DCGM it supports is unknown (the host has {dcgm_text})",
                                        [key]))
            continue
        exporter, built, supported, _source = pairing
        wrong = sorted(k for k, r in found.items() if releases.series(r) not in supported)
        if found and not wrong:
            continue
        want = " or ".join(f"{s}.x" for s in supported)
        out.append(Disagreement(DCGM_EXPORTER, f"{package_name(key)} {exporter} (built with DCGM {built}) needs DCGM "
                                               f"{want}; the host has {dcgm_text}", [key, *wrong]))
    return out


# --- the amdsmi binding x libamd_smi ---------------------------------------------------------------------------


def _amdsmi_what(name: str, version: str) -> str:
    """`` (amdsmi 26.1.0 for ROCm 7.1.0)`` after a version where its leading number is not the ROCm release, else
    nothing."""
    own, rocm = releases.amdsmi_build(name, version)
    if own and rocm:
        return f" (amdsmi {own} for ROCm {rocm})"
    return f" (amdsmi {own}; no ROCm release in its version)" if own else ""


def amdsmi(installed: Mapping[str, str], binding: Optional[Tuple[str, str]] = None,
           leaves: str = "the host has", active_release: Optional[str] = None) -> List[Disagreement]:
    """The amdsmi binding packaged on its own (Debian's amd-smi, python3-amdsmi) or installed with pip (``binding``:
    (version, where), a host fact) at a ROCm release series no amdsmi library present has (read by
    :func:`agent.policy.releases.amdsmi_build`: ``26.1.0.70100`` is amdsmi 26.1.0 for ROCm 7.1.0). A binding whose
    version carries amdsmi's own number only is judged by that number against the libraries'.

    Judged per tree: with ``active_release`` (the release of the tree update-alternatives points at, ``10.0``) and a
    library of that release present, only the active tree's libraries count, since the binding loads the library
    through ``/opt/rocm/core``: a 7.14 binding on a host switched to 10.0 is a mismatch though 7.14 is installed."""
    libraries = {k: releases.amdsmi_build(package_name(k), installed[k])
                 for k in _keys(installed, AMDSMI_LIBRARY_PACKAGES)}
    active = releases.series(active_release)
    if active and any(releases.series(rocm) == active for _own, rocm in libraries.values()):
        libraries = {k: v for k, v in libraries.items() if releases.series(v[1]) == active}
    lib_rocm = {releases.series(rocm) for _own, rocm in libraries.values() if rocm}
    lib_own = {releases.series(own) for own, _rocm in libraries.values() if own}
    shown = {k: f"ROCm {rocm}" if rocm else f"amdsmi {own}" if own else "an unknown release"
             for k, (own, rocm) in libraries.items()}
    lib_text = f"libamd_smi of {_grouped(shown, 2)}" if libraries else "no amdsmi library package"
    sides = [(k, f"{package_name(k)} {installed[k]}{_amdsmi_what(package_name(k), installed[k])}",
              releases.amdsmi_build(package_name(k), installed[k])) for k in _keys(installed, AMDSMI_BINDING_PACKAGES)]
    if binding is not None:
        version, where = binding
        sides.append(("", f"the pip amdsmi binding {version}{_amdsmi_what('amdsmi', version)} ({where})",
                      releases.amdsmi_build("amdsmi", version)))
    out = []
    for key, label, (own, rocm) in sides:
        if (rocm and releases.series(rocm) in lib_rocm) or (not rocm and own and releases.series(own) in lib_own):
            continue
        wanted = f"ROCm {releases.series(rocm)}" if rocm else f"amdsmi {releases.series(own)}" if own else \
            "a release its version does not say"
        out.append(Disagreement(AMDSMI, f"{label} needs libamd_smi of {wanted}; {leaves} {lib_text}",
                                [k for k in (key, *sorted(libraries)) if k]))
    return out
