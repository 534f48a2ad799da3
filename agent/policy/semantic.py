"""Semantic checks of a valid policy: rules that parse but can never match, or that block everything (pure).

Structural validation (load.py, model.py) proves a policy is well-typed; these checks catch what is still wrong:

- a spec of the wrong kind for its field: a package version where a release belongs (``amdgpu =
  "1:6.8.5.60202-..."``, ``rocm = "6.2.2.60202"``), a package name where a kernel release belongs (``[kernel] allow
  = "linux-image-6.8.0-45-generic"``), a release where a whole package version is compared (``amdgpu_package =
  "6.2.*"``), an exact release too short to equal any real one (``rocm = "6.2"``);
- package names that are misspelt (``driver_package = "amdgpu-dkmss"``) or are versions;
- with ``require_amd_matrix = true``, a pairing that admits no combination of AMD's compatibility matrix;
- a ROCm release (a pairing's ``rocm``, or one installed on this host, classic or TheRock) that AMD's matrix does
  not know (a warning: AMD has published no table for ROCm 7.13, for one);
- with the host's facts (:class:`Inventory`, gathered by the command): package globs and kernel specs that match
  nothing installed on this host (warnings: a policy may be written before the packages arrive).

Input: each policy file's validated :class:`~agent.policy.model.Policy`, the merged policy, the matrix and the
inventory. Output: :class:`Problem` values; the CLI prints them with the same ``file: field -> 1: message``
shape PolicyError uses (errors) or with a leading ``warning:`` (warnings).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from agent.defaults import AMD_DRIVER_PACKAGE, ROCM_CORE_PACKAGE, THEROCK_BASE_PACKAGE
from agent.hostfacts.package_keys import package_name
from agent.policy import companions, releases
from agent.policy.globs import matched_by_some
from agent.policy.spec import SpecError, matches, parse_entry

if TYPE_CHECKING:
    from agent.policy.matrix import Matrix
    from agent.policy.model import Policy
    from agent.policy.sections import Spec
    from agent.policy.sections.amd import AmdPairing

ERROR, WARNING = "error", "warning"
# Packages known to carry the amdgpu driver and the ROCm release (their versions encode the release).
AMD_DRIVER_PACKAGES = (AMD_DRIVER_PACKAGE, "amdgpu")
ROCM_PACKAGES = (ROCM_CORE_PACKAGE, THEROCK_BASE_PACKAGE)
# AMD's side-by-side installs: rocm-core6.4.1 (classic), amdrocm-base7.13 and amdrocm-base10.0 (TheRock)
_VERSIONED_ROCM_PACKAGE = re.compile(r"^(rocm-core|amdrocm-base)\d+(\.\d+)*$")
# Ubuntu's linux-image version (ABI.upload): 6.8.0-45.45, 6.5.0-41.41~22.04.2; not a kernel release.
_KERNEL_PACKAGE_VERSION = re.compile(r"^\d+\.\d+(\.\d+)*-\d+\.\d+(~\S*)?$")
_KERNEL_NAME_PREFIXES = ("linux-image-unsigned-", "linux-modules-unsigned-", "linux-image-", "linux-modules-",
                         "linux-headers-", "kernel-core-", "kernel-modules-", "kernel-")
_GLOB = set("*?[")


@dataclass(frozen=True)
class Problem:
    """One finding: ``where`` is the field path (``kernel -> allow -> 1``), ``file`` the policy file it is in."""

    where: str
    message: str
    severity: str = ERROR
    file: str = ""

    def text(self) -> str:
        """``field -> 1: message``, the shape PolicyError's problems have."""
        return f"{self.where}: {self.message}" if self.where else self.message

    def to_dict(self) -> Dict[str, str]:
        return {"severity": self.severity, "file": self.file, "field": self.where, "message": self.message}


@dataclass(frozen=True)
class Inventory:
    """What this host has: guarded package key -> version, and its kernel releases (installed and running)."""

    installed: Mapping[str, str]
    kernels: Tuple[str, ...] = ()


def check_policy(parts: Sequence[Tuple[str, Policy]], merged: Policy, matrix: Optional[Matrix] = None,
                 inventory: Optional[Inventory] = None,
                 exporter_table: Optional[companions.ExporterTable] = None) -> List[Problem]:
    """Every semantic problem of every file (``parts``: file, its own policy) given the merged policy's context;
    ``exporter_table``: gpuguard's dcgm-exporter table in use (None: the package's)."""
    out: List[Problem] = []
    for file, policy in parts:
        found = _kind_problems(policy, matrix)
        bad_pairings = {p.where.split(" -> ")[2] for p in found if p.where.startswith("amd -> pairing -> ")}
        if matrix is not None and policy.amd:
            for i, pairing in enumerate(policy.amd.pairing, 1):
                if str(i) in bad_pairings:
                    continue
                outside = _matrix_problems(i, pairing, matrix) if merged.policy.require_amd_matrix else []
                found += outside or _unknown_release_problems(i, pairing, matrix)  # the error says it already
        if inventory is not None:
            found += _host_problems(policy, inventory, exporter_table)
            if matrix is not None and policy.amd:
                found += _installed_release_problems(inventory, matrix)
        out += [Problem(p.where, p.message, p.severity, file) for p in found]
    return out + _health_problems(parts, merged)


def _health_problems(parts: Sequence[Tuple[str, Policy]], merged: Policy) -> List[Problem]:
    """Files that set ``[health] after_change`` differently: the last one in name order wins, said once per file."""
    settings = [(file, p.health.after_change) for file, p in parts
                if p.health is not None and "after_change" in p.health.model_fields_set]
    if len({value for _, value in settings}) < 2 or merged.health is None:
        return []
    winner = merged.health.after_change
    return [Problem("health -> after_change", f"{value!r} is overridden by a later file: the merged policy says "
                    f"{winner!r}", WARNING, file) for file, value in settings if value != winner]


# --- the kind of value a field holds ---------------------------------------------------------------------------


def _items(spec: Optional[Spec]) -> List[Tuple[int, str]]:
    if spec is None:
        return []
    items = [spec] if isinstance(spec, str) else list(spec)
    return [(i, item) for i, item in enumerate(items, 1)]


def _where(path: str, spec: Spec, index: int) -> str:
    return path if isinstance(spec, str) else f"{path} -> {index}"


def _texts(item: str) -> Tuple[str, List[Tuple[str, str]]]:
    """The entry's kind and its (operator, text) parts: a glob's pattern, a range's versions."""
    try:
        entry = parse_entry(item)
    except SpecError:  # the model has refused it already
        return "bad", []
    if entry[0] == "glob":
        return "glob", [("glob", entry[1])]
    if entry[0] == "range":
        return "range", [(op, version) for op, version in entry[1]]
    return entry[0], []


def _is_package_version(text: str) -> bool:
    """An epoch, a revision, or AMD's release code (a 5- or 8-digit component): a package version."""
    return ":" in text or "-" in text or any(len(c) >= 5 and c.isdigit() for c in text.split("."))


# field -> (what it holds, with its article; what a package version there is; parts of a real release)
_RELEASE_WORDS = {"amdgpu": ("a driver release", "an amdgpu-dkms package version", 3),
                  "rocm": ("a ROCm release", "a rocm-core package version", 3),
                  "driver": ("an NVIDIA driver release", "a package version", 2),
                  "cuda": ("a CUDA release", "a package version", 3)}


def _release_problems(path: str, field: str, spec: Spec, matrix: Optional[Matrix]) -> List[Problem]:
    """A release field (``amdgpu``, ``rocm``, ``driver``, ``cuda``) holding a package name or version."""
    what, version_kind, parts = _RELEASE_WORDS[field]
    out = []
    for index, item in _items(spec):
        where = _where(path, spec, index)
        kind, texts = _texts(item)
        for op, text in texts:
            if text[:1].isalpha():
                out.append(Problem(where, f"{text!r} is a package name, not {what} (such as "
                                          f"{_release_example(field)!r})"))
            elif _is_package_version(text):
                out.append(Problem(where, _package_version_message(field, text, what, version_kind)))
            elif kind == "range" and op == "==" and len(text.split(".")) < parts:
                out.append(Problem(where, f"{text!r} equals no {what.split(' ', 1)[1]}: releases read from the "
                                          f"packages have {parts} parts ({_release_example(field)}); write "
                                          f"\"{text}.*\" or a range (\">= {text}, << ...\")"))
            elif field == "amdgpu" and matrix is not None:
                out += _dkms_base_problem(where, text, matrix)
    return out


def _release_example(field: str) -> str:
    return {"amdgpu": "6.2.2", "rocm": "6.2.2", "driver": "580.95.05", "cuda": "13.0.96"}[field]


def _package_version_message(field: str, text: str, what: str, version_kind: str) -> str:
    release = None
    if not _GLOB & set(text):
        if field == "amdgpu":
            release = releases.amdgpu_driver_release(text)
        elif field in ("rocm", "driver", "cuda"):
            release = releases.dotted_release(text, parts=3)
    if release:
        glob = f"{releases.series(release, 1 if field == 'driver' else 2)}.*"  # NVIDIA branches are 580.*
        instead = f"write {field} = \"{release}\" (or \"{glob}\")"
    else:
        instead = f"write {what.split(' ', 1)[1]} such as {_release_example(field)}"
    if field in ("amdgpu", "rocm"):
        instead += f", or match the whole version with {field}_package"
    return f"{text!r} is {version_kind}, not {what}: {instead}"


def _dkms_base_problem(where: str, text: str, matrix: Matrix) -> List[Problem]:
    """``amdgpu = "6.8.5"``: the DKMS kernel-driver base of driver 6.2, not a driver release."""
    head = re.match(r"^\d+\.\d+", text)
    if head is None or head.group(0) in {row.series for row in matrix.driver}:
        return []
    rows = [row for row in matrix.driver if row.dkms_base and releases.series(row.dkms_base) == head.group(0)]
    row = next((r for r in rows if r.dkms_base == text), rows[0] if rows else None)
    if row is None:
        return []
    return [Problem(where, f"{text!r} is the DKMS kernel-driver base of amdgpu driver {row.series}.x (amdgpu-dkms "
                           f"{row.example_package or row.dkms_base}), not a driver release: write amdgpu = "
                           f"\"{row.series}.*\"")]


def _kernel_problems(path: str, spec: Optional[Spec]) -> List[Problem]:
    """A kernel field (``[kernel] allow``, a pairing's ``kernels``) holding a package name or version."""
    out: List[Problem] = []
    for index, item in _items(spec):
        where = _where(path, spec, index)  # type: ignore[arg-type]
        for _op, text in _texts(item)[1]:
            if text[:1].isalpha():
                release = next((text[len(p):] for p in _KERNEL_NAME_PREFIXES
                                if text.startswith(p) and text[len(p):][:1].isdigit()), None)
                if release:
                    out.append(Problem(where, f"{text!r} is a package name, not a kernel release: write "
                                              f"{release!r} (as uname -r prints it)"))
                else:
                    out.append(Problem(where, f"{text!r} is a package name, not a kernel release (uname -r, such as "
                                              f"'6.8.0-45-generic'); to hold a package, list it in [frozen] packages"))
            elif ":" in text or _KERNEL_PACKAGE_VERSION.match(text):
                out.append(Problem(where, f"{text!r} is a kernel package version, not a kernel release (uname -r, "
                                          f"such as '6.8.0-45-generic')"))
    return out


def _package_version_problems(path: str, field: str, spec: Optional[Spec]) -> List[Problem]:
    """A package-version field (``amdgpu_package``, ``rocm_package``, ``versions.allow``) holding a name or a
    release."""
    out = []
    for index, item in _items(spec):
        where = _where(path, spec, index)  # type: ignore[arg-type]
        kind, texts = _texts(item)
        for op, text in texts:
            release_shaped = not _is_package_version(text)
            if text[:1].isalpha():
                out.append(Problem(where, f"{text!r} is a package name, not a package version"))
            elif field == "amdgpu_package" and release_shaped:
                out.append(Problem(where, f"{text!r} is a driver release, not an amdgpu-dkms package version (such "
                                          f"as 1:6.8.5.60202-2041575.22.04, epoch and build included): put the "
                                          f"release in amdgpu, or compare whole versions (\">= 1:6.8.5.60202\")"))
            elif field == "rocm_package" and release_shaped and op == "==" and len(text.split(".")) <= 3:
                out.append(Problem(where, f"{text!r} is a ROCm release; rocm-core versions look like "
                                          f"6.2.2.60202-116~22.04, so it equals none: write rocm = \"{text}\", or "
                                          f"rocm_package = \"{text}.*\""))
            elif field == "allow" and kind == "range" and op == "==" and release_shaped:
                out.append(Problem(where, f"{text!r} has no revision: it equals only a version without one "
                                          f"(not {text}-1); write \"{text}-*\" or \">= {text}, << ...\"", WARNING))
    return out


def _name_problems(path: str, names: Iterable[str], known: Sequence[str] = ()) -> List[Problem]:
    """Package names or globs that are versions, or close misspellings of a known package."""
    out = []
    for index, name in enumerate(names, 1):
        where = f"{path} -> {index}" if not known else path
        if name[:1].isdigit() or "=" in name:
            out.append(Problem(where, f"{name!r} is a version, not a package name or glob"))
        elif known and name not in known and not _VERSIONED_ROCM_PACKAGE.match(name) and not _GLOB & set(name):
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
            if close:
                out.append(Problem(where, f"{name!r} is not a package gpuguard knows; did you mean {close[0]!r}?"))
            else:
                out.append(Problem(where, f"{name!r} is not a package gpuguard knows to carry this release "
                                          f"({', '.join(known)}): its version must encode the release as AMD's do",
                                   WARNING))
    return out


def _kind_problems(policy: Policy, matrix: Optional[Matrix]) -> List[Problem]:
    out = _name_problems("policy -> guarded", policy.policy.guarded)
    if policy.amd:
        amd = policy.amd
        if "driver_package" in amd.model_fields_set:
            out += _name_problems("amd -> driver_package", [amd.driver_package], AMD_DRIVER_PACKAGES)
        if "rocm_package" in amd.model_fields_set:
            out += _name_problems("amd -> rocm_package", [amd.rocm_package], ROCM_PACKAGES)
        for i, pairing in enumerate(amd.pairing, 1):
            base = f"amd -> pairing -> {i}"
            out += _release_problems(f"{base} -> amdgpu", "amdgpu", pairing.amdgpu, matrix)
            out += _release_problems(f"{base} -> rocm", "rocm", pairing.rocm, None)
            out += _package_version_problems(f"{base} -> amdgpu_package", "amdgpu_package", pairing.amdgpu_package)
            out += _package_version_problems(f"{base} -> rocm_package", "rocm_package", pairing.rocm_package)
            out += _kernel_problems(f"{base} -> kernels", pairing.kernels)
    if policy.kernel:
        out += _name_problems("kernel -> packages", policy.kernel.packages)
        out += _kernel_problems("kernel -> allow", policy.kernel.allow)
    if policy.nvidia:
        out += _name_problems("nvidia -> driver_packages", policy.nvidia.driver_packages)
        out += _name_problems("nvidia -> cuda_packages", policy.nvidia.cuda_packages)
        for i, npairing in enumerate(policy.nvidia.pairing, 1):
            out += _release_problems(f"nvidia -> pairing -> {i} -> driver", "driver", npairing.driver, None)
            out += _release_problems(f"nvidia -> pairing -> {i} -> cuda", "cuda", npairing.cuda, None)
    for i, rule in enumerate(policy.versions, 1):
        out += _name_problems(f"versions -> {i} -> packages", rule.packages)
        out += _package_version_problems(f"versions -> {i} -> allow", "allow", rule.allow)
    if policy.frozen:
        out += _name_problems("frozen -> packages", policy.frozen.packages)
    if policy.companions and not policy.companions.enabled():
        out.append(Problem("companions", "every companion rule is set to false: the section judges nothing",
                           WARNING))
    return out


# --- AMD's compatibility matrix --------------------------------------------------------------------------------


def _candidates(matrix: Matrix) -> Tuple[List[Optional[str]], List[Optional[str]]]:
    """Driver and ROCm releases the matrix knows (patch numbers 0-9 of each series), and None (absent)."""
    drivers: List[Optional[str]] = [None] + [f"{row.series}.{n}" for row in matrix.driver for n in range(10)]
    rocms: List[Optional[str]] = [None]
    for rocm_row in matrix.rocm:
        rocms += sorted({*rocm_row.releases, *(f"{rocm_row.series}.{n}" for n in range(10))})
    return drivers, rocms


def _supported(matrix: Matrix, driver: Optional[str], rocm: Optional[str]) -> bool:
    """Whether the evaluator's matrix check would let this pair through (an absent side is not judged)."""
    if rocm is None:
        return True
    rocm_series = releases.series(rocm)
    if rocm_series not in {row.series for row in matrix.rocm}:
        return False
    if driver is None:
        return True
    row = next((d for d in matrix.driver if d.series == releases.series(driver)), None)
    return row is not None and rocm_series in row.rocm


def _matrix_problems(index: int, pairing: AmdPairing, matrix: Matrix) -> List[Problem]:
    drivers, rocms = _candidates(matrix)
    admitted = [(d, r) for d in drivers if matches(pairing.amdgpu, d) for r in rocms if matches(pairing.rocm, r)]
    if any(_supported(matrix, d, r) for d, r in admitted):
        return []
    admitted_drivers = {releases.series(d) for d in drivers if d is not None and matches(pairing.amdgpu, d)}
    rows = [row for row in matrix.driver if row.series in admitted_drivers]
    known = "; ".join(f"driver {row.series}.x supports ROCm {', '.join(row.rocm)}" for row in rows)
    return [Problem(f"amd -> pairing -> {index}",
                    f"'{pairing.name}' (amdgpu {_describe(pairing.amdgpu)} + ROCm {_describe(pairing.rocm)}) admits "
                    f"no combination in AMD's compatibility matrix (recorded {matrix.recorded}), and "
                    f"require_amd_matrix = true refuses everything outside it"
                    + (f" ({known})" if known else ""))]


def _known_rocm_series(matrix: Matrix) -> List[str]:
    """The ROCm series the matrix has a row for, or that a driver row lists (7.14 and 10.0: AMD's driver table)."""
    return sorted({row.series for row in matrix.rocm} | {r for row in matrix.driver for r in row.rocm},
                  key=lambda s: [int(p) for p in s.split(".")])


def _spec_series(item: str) -> Optional[str]:
    """The ROCm series an exact release or a series glob names (``7.13.0``, ``7.13.*``, ``== 7.13.1`` -> ``7.13``);
    None for ranges and for ``any``/``none``."""
    kind, texts = _texts(item)
    if kind == "glob" and texts:
        head = texts[0][1].split("*", 1)[0].rstrip(".")
    elif kind == "range" and len(texts) == 1 and texts[0][0] == "==":
        head = texts[0][1]
    else:
        return None
    parts = head.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        return None
    return ".".join(parts[:2])


def _unknown_release_problems(index: int, pairing: AmdPairing, matrix: Matrix) -> List[Problem]:
    """A pairing's ROCm release that AMD's compatibility matrix does not know (a warning: the pairing may be right,
    the matrix cannot say)."""
    known = _known_rocm_series(matrix)
    out = []
    for i, item in _items(pairing.rocm):
        series = _spec_series(item)
        if series is not None and series not in known:
            out.append(Problem(_where(f"amd -> pairing -> {index} -> rocm", pairing.rocm, i),
                               f"ROCm {series} is a release AMD's compatibility matrix (recorded {matrix.recorded}) "
                               f"does not know (it knows ROCm {', '.join(known)}): its drivers, OS releases and GPUs "
                               f"cannot be checked, and require_amd_matrix = true refuses it", WARNING))
    return out


def _installed_release_problems(inventory: Inventory, matrix: Matrix) -> List[Problem]:
    """ROCm releases installed on this host (rocm-core<ver>, amdrocm-base<X.Y>) that the matrix does not know."""
    known = _known_rocm_series(matrix)
    carries = [ROCM_CORE_PACKAGE, THEROCK_BASE_PACKAGE]
    out = []
    for key, version in sorted(inventory.installed.items()):
        name = package_name(key)
        if name not in carries and not _VERSIONED_ROCM_PACKAGE.match(name):
            continue
        series = releases.series(releases.rocm_release(version))
        if series is not None and series not in known:
            out.append(Problem("amd", f"this host has ROCm {releases.rocm_release(version)} ({name} {version}), a "
                                      f"release AMD's compatibility matrix (recorded {matrix.recorded}) does not know",
                               WARNING))
    return out


def _describe(spec: Spec) -> str:
    return " or ".join([spec] if isinstance(spec, str) else list(spec))


# --- what this host has ----------------------------------------------------------------------------------------


def _host_problems(policy: Policy, inventory: Inventory,
                   exporter_table: Optional[companions.ExporterTable]) -> List[Problem]:
    matches_some = matched_by_some([package_name(k) for k in inventory.installed])
    out = []

    def unmatched(path: str, patterns: Sequence[str], numbered: bool = True) -> None:
        for index, pattern in enumerate(patterns, 1):  # one binary search each: a policy may name 100,000
            if not matches_some(pattern):
                out.append(Problem(f"{path} -> {index}" if numbered else path,
                                   f"{pattern!r} matches no package installed on this host", WARNING))

    unmatched("policy -> guarded", policy.policy.guarded)
    if policy.amd:
        for field in ("driver_package", "rocm_package"):
            if field in policy.amd.model_fields_set:
                unmatched(f"amd -> {field}", [getattr(policy.amd, field)], numbered=False)
        for i, pairing in enumerate(policy.amd.pairing, 1):
            out += _kernels_unmatched(f"amd -> pairing -> {i} -> kernels", pairing.kernels, inventory)
    if policy.kernel:
        if "packages" in policy.kernel.model_fields_set:
            unmatched("kernel -> packages", policy.kernel.packages)
        out += _kernels_unmatched("kernel -> allow", policy.kernel.allow, inventory)
    if policy.nvidia:
        for field in ("driver_packages", "cuda_packages"):
            if field in policy.nvidia.model_fields_set:
                unmatched(f"nvidia -> {field}", getattr(policy.nvidia, field))
    for i, rule in enumerate(policy.versions, 1):
        unmatched(f"versions -> {i} -> packages", rule.packages)
    if policy.frozen:
        unmatched("frozen -> packages", policy.frozen.packages)
    if policy.companions:
        out += _companion_problems(policy.companions.enabled(), inventory, exporter_table)
    return out


def _companion_problems(enabled: Sequence[str], inventory: Inventory,
                        exporter_table: Optional[companions.ExporterTable]) -> List[Problem]:
    """Companion rules with none of their packages on this host (they judge nothing here yet), and installed
    dcgm-exporter releases gpuguard's table does not know (the rule refuses them)."""

    matches_some = matched_by_some([package_name(k) for k in inventory.installed])
    judged = {"fabricmanager": companions.FABRICMANAGER_PACKAGES, "dcgm": companions.DCGM_PACKAGES,
              "dcgm_exporter": companions.DCGM_EXPORTER_PACKAGES,
              "amdsmi": companions.AMDSMI_BINDING_PACKAGES + companions.AMDSMI_LIBRARY_PACKAGES}
    out = []
    for rule in enabled:
        if not any(matches_some(pattern) for pattern in judged[rule]):
            out.append(Problem(f"companions -> {rule}", f"none of its packages ({', '.join(judged[rule])}) is "
                                                        f"installed on this host: it judges nothing here yet", WARNING))
    if "dcgm_exporter" in enabled:
        if exporter_table is None:
            from agent.policy.knowledge_files import exporter_table_in_use

            exporter_table = exporter_table_in_use()
        dated = exporter_table.dated
        newer = {k for item in companions.unknown_to_table(inventory.installed, exporter_table) for k in item.packages}
        for key, version in sorted(inventory.installed.items()):
            if package_name(key) not in companions.DCGM_EXPORTER_PACKAGES or \
                    companions.exporter_pairing(version, exporter_table) is not None:
                continue
            if key in newer:
                out.append(Problem("companions -> dcgm_exporter",
                                   f"{package_name(key)} {version} installed here is newer than gpuguard's "
                                   f"dcgm-exporter table (dated {dated}) knows: it is "
                                   f"reported, not judged; update gpuguard", WARNING))
                continue
            out.append(Problem("companions -> dcgm_exporter",
                               f"{package_name(key)} {version} installed here is not in gpuguard's dcgm-exporter "
                               f"table (dated {dated}): changes to DCGM or the "
                               f"exporter are refused while it is installed; set dcgm_exporter = false or "
                               f"update gpuguard",
                               WARNING))
    return out


def _kernels_unmatched(path: str, spec: Optional[Spec], inventory: Inventory) -> List[Problem]:
    if spec is None or not inventory.kernels or any(matches(spec, k) for k in inventory.kernels):
        return []
    return [Problem(path, f"matches none of this host's kernels ({', '.join(inventory.kernels)})", WARNING)]


def inventory_kernels(installed: Mapping[str, str], manager: str, running: Optional[str]) -> Tuple[str, ...]:
    """The host's kernel releases as policies write them (rpm: no architecture, as the evaluator judges them): the
    running one first, then those its kernel packages install."""
    found: List[str] = [releases.policy_kernel_release(running, manager)] if running else []
    for key, version in sorted(installed.items()):
        release = releases.kernel_release_of(key, version, manager=manager)
        if release and release not in found:
            found.append(release)
    return tuple(found)
