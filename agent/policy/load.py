"""Load policies: one TOML file, or every ``*.toml`` of a directory merged in name order; compile them.

Every problem of every file is reported at once as ``file: field -> 1: message`` (PolicyError). Merging: tables
merge key by key, lists (pairings, package lists) are concatenated, and a later file's scalar wins.
"""

from __future__ import annotations

import datetime as dt
import errno
import hashlib
import json
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from pydantic import ValidationError

from agent.defaults import DEFAULT_POLICY_DIR
from agent.errors import InputFileError, PolicyError
from agent.files import read_bytes_bounded
from agent.policy.compiled import (
    AMD_STACK_PACKAGES,
    COMPILED_FORMAT,
    DEFAULT_KERNEL_PACKAGES,
    DEFAULT_NVIDIA_DRIVER_PACKAGES,
    CompiledPolicy,
    check_compiled,
)
from agent.policy.model import AmdSection, Policy
from agent.strictjson import MAX_NESTING_DEPTH, nesting_depth
from agent.tomlreader import MAX_TOML_BYTES, toml_module, toml_worded
from agent.validation import validation_problems


@dataclass(frozen=True)
class LoadedPolicy:
    """A validated policy, the files it came from (path, sha256) and each file's own policy (path, policy), which
    the semantic checks (agent/policy/semantic.py) judge file by file."""

    policy: Policy
    sources: Tuple[Tuple[str, str], ...]
    path: str
    parts: Tuple[Tuple[str, Policy], ...] = ()


def _merge(into: Dict[str, Any], extra: Dict[str, Any]) -> Dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            into[key] = _merge(dict(into[key]), value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = list(into[key]) + list(value)
        else:
            into[key] = value
    return into


def _policy_files(path: Path) -> List[Path]:
    """The policy files of ``path``: itself, or a directory's ``*.toml`` in name order (the matrix aside).

    Nothing named ``*.toml`` in a directory is skipped without a word: a symbolic link that loops or points
    nowhere is a PolicyError naming it; a FIFO, socket or device is listed, so that its read names it (never read
    through, never waited on). Only directories are left out.
    """
    if path.is_dir():
        try:
            entries = sorted(p for p in path.iterdir() if p.suffix == ".toml" and p.name != "amd-compat-matrix.toml")
        except OSError as exc:
            raise PolicyError(str(path), [f"cannot list the directory: {exc.strerror or exc}"]) from None
        files, problems = [], []
        for entry in entries:
            try:
                if stat.S_ISDIR(entry.stat().st_mode):
                    continue
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    problems.append(f"{entry.name}: a symbolic link loop ({exc.strerror}): fix or remove it")
                elif entry.is_symlink():
                    problems.append(f"{entry.name}: a symbolic link to nothing ({exc.strerror or exc}): fix or "
                                    f"remove it")
                else:
                    problems.append(f"{entry.name}: {exc.strerror or exc}")
                continue
            files.append(entry)
        if problems:
            raise PolicyError(str(path), problems)
        if not files:
            raise PolicyError(str(path), ["no policy files (*.toml) in this directory: nothing is pinned; add one "
                                          "(see /etc/gpuguard/example-policy.toml)"])
        return files
    if not path.exists():
        raise PolicyError(str(path), ["no such file or directory"])
    return [path]


def load_policy(path: str = DEFAULT_POLICY_DIR) -> LoadedPolicy:
    """Read, validate and merge a policy file or directory; PolicyError lists every problem of every file."""
    root = Path(path)
    files = _policy_files(root)
    problems: List[str] = []
    merged: Dict[str, Any] = {}
    sources = []
    parts: List[Tuple[str, Policy]] = []
    tomllib = toml_module()
    for file in files:
        label = file.name if root.is_dir() else ""
        prefix = f"{label}: " if label else ""
        try:  # never blocks (a FIFO or a device in place of the file) and never reads past the cap
            raw = read_bytes_bounded(str(file), MAX_TOML_BYTES)
        except InputFileError as exc:
            problems.append(f"{prefix}{exc.reason}")
            continue
        sources.append((str(file), hashlib.sha256(raw).hexdigest()))
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            problems.append(f"{prefix}not valid TOML: {exc}")
            continue
        except RecursionError:
            problems.append(f"{prefix}not valid TOML: nested too deeply")
            continue
        if nesting_depth(data) > MAX_NESTING_DEPTH:
            problems.append(f"{prefix}not valid TOML: nested deeper than {MAX_NESTING_DEPTH} levels")
            continue
        try:
            parts.append((str(file), Policy.model_validate(data)))
        except ValidationError as exc:
            problems += [prefix + p for p in validation_problems([toml_worded(e) for e in exc.errors()])]
            continue
        merged = _merge(merged, data)
    if problems:
        raise PolicyError(str(root), problems)
    policy = Policy.model_validate(merged)
    problems = _cross_checks(policy)
    if problems:
        raise PolicyError(str(root), problems)
    return LoadedPolicy(policy=policy, sources=tuple(sources), path=str(root), parts=tuple(parts))


def _cross_checks(policy: Policy) -> List[str]:
    problems = []
    if policy.rule_count() == 0:
        problems.append("the policy defines no rules (amd.pairing, kernel.allow, nvidia.pairing, versions, "
                        "frozen.packages, companions or policy.require_amd_matrix): it would pin nothing")
    for section, pairings in (("amd", policy.amd.pairing if policy.amd else []),
                              ("nvidia", policy.nvidia.pairing if policy.nvidia else [])):
        names = [p.name for p in pairings]
        for name in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"{section} -> pairing: name {name!r} is used more than once")
    return problems


def kernel_packages(policy: Policy) -> List[str]:
    """The kernel package globs: the [kernel] section's, or the defaults when the policy has none."""
    return list(policy.kernel.packages if policy.kernel else DEFAULT_KERNEL_PACKAGES)


def guarded_patterns(policy: Policy) -> List[str]:
    """Package globs the policy guards: what the fail-safe protects when the policy cannot be read, what the
    known-good set holds and what a rollback restores. With [amd], the whole AMD stack (AMD_STACK_PACKAGES) and
    every ``<driver_package>-*`` (its firmware) besides the driver and ROCm packages."""
    patterns: List[str] = list(policy.policy.guarded)
    if policy.amd:
        patterns += [policy.amd.driver_package, f"{policy.amd.driver_package}-*", policy.amd.rocm_package]
        patterns += AMD_STACK_PACKAGES
    if policy.amd or policy.kernel:
        patterns += kernel_packages(policy)
    if policy.nvidia:
        patterns += policy.nvidia.driver_packages + policy.nvidia.cuda_packages
    for rule in policy.versions:
        patterns += rule.packages
    if policy.frozen:
        patterns += policy.frozen.packages
    if policy.companions:
        from agent.policy.companions import family

        driver = policy.nvidia.driver_packages if policy.nvidia else DEFAULT_NVIDIA_DRIVER_PACKAGES
        for name in policy.companions.enabled():
            patterns += family(f"companion.{name}", driver)
    return list(dict.fromkeys(patterns))


def compile_policy(loaded: LoadedPolicy, matrix: Optional[Any] = None,
                   now: Optional[dt.datetime] = None) -> Dict[str, Any]:
    """The plain-JSON form the hook evaluates; ``matrix`` (a Matrix) is required when the policy asks for it."""
    policy = loaded.policy
    p = policy.policy
    data: Dict[str, Any] = {
        "format": COMPILED_FORMAT,
        "name": p.name,
        "compiled_at": (now or dt.datetime.now(dt.timezone.utc)).isoformat(),
        "sources": [{"path": path, "sha256": digest} for path, digest in loaded.sources],
        "action": p.action,
        "failsafe": p.failsafe,
        "max_override_minutes": p.max_override_minutes,
        "guarded": guarded_patterns(policy),
        "kernel_packages": kernel_packages(policy),
        "amd": None, "kernel": None, "nvidia": None, "frozen": None, "matrix": None, "versions": [],
    }
    if policy.companions:
        data["companions"] = policy.companions.model_dump()
    # The matrix judges the AMD packages too: their names are compiled in even without pairings.
    amd = policy.amd or (AmdSection() if p.require_amd_matrix else None)
    if amd:
        data["amd"] = {"driver_package": amd.driver_package, "rocm_package": amd.rocm_package,
                       "action": amd.action, "side_by_side": amd.side_by_side,
                       "pairings": [pair.model_dump() for pair in amd.pairing]}
    if policy.kernel:
        data["kernel"] = policy.kernel.model_dump()
    if policy.nvidia:
        section = policy.nvidia.model_dump()
        section["pairings"] = section.pop("pairing")
        data["nvidia"] = section
    if policy.frozen:
        data["frozen"] = policy.frozen.model_dump()
    data["versions"] = [rule.model_dump() for rule in policy.versions]
    if policy.health:
        data["health"] = policy.health.model_dump()
    if p.require_amd_matrix:
        if matrix is None:
            raise PolicyError(loaded.path, ["policy -> require_amd_matrix: the AMD compatibility matrix is needed "
                                            "to compile this policy"])
        data["matrix"] = {"action": None, **matrix.to_compiled()}
    check_compiled(json.loads(json.dumps(data)), "<compiled>")
    return data


def compiled_from(loaded: LoadedPolicy, matrix: Optional[Any] = None) -> CompiledPolicy:
    """Compile in memory (``policy explain``, the rollback watcher, tests)."""
    return CompiledPolicy(json.loads(json.dumps(compile_policy(loaded, matrix))), loaded.path)


def load_and_compile(path: str = DEFAULT_POLICY_DIR, matrix_path: Optional[str] = None) -> Tuple[LoadedPolicy,
                                                                                                  CompiledPolicy]:
    """Load a policy and compile it, loading the AMD matrix only when the policy requires it."""
    loaded = load_policy(path)
    matrix = None
    if loaded.policy.policy.require_amd_matrix:
        from agent.policy.matrix import load_matrix

        matrix = load_matrix(matrix_path)
    return loaded, compiled_from(loaded, matrix)


def write_compiled(path: str, compiled: CompiledPolicy) -> None:
    """Write the compiled policy atomically (the hook may read it at any moment)."""
    from agent.files import write_atomically

    write_atomically(path, json.dumps(compiled.data, indent=2, sort_keys=True) + "\n")
