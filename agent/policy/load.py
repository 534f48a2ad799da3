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
from typing import Any, Dict, List, Optional, Tuple, get_args

from pydantic import ValidationError

from agent.defaults import DEFAULT_POLICY_DIR
from agent.errors import InputFileError, PolicyError
from agent.files import read_bytes_bounded
from agent.policy.compiled import COMPILED_FORMAT, CompiledPolicy, check_compiled
from agent.policy.evaluate import FAMILIES, family
from agent.policy.knowledge_files import BundleKnowledge
from agent.policy.model import SECTIONS, Policy
from agent.policy.table_unknown import THEROCK_RELEASES_TABLE
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
    for name, section in SECTIONS.items():
        problems += section.merged_problems(getattr(policy, name))
    return problems


class _Source:
    """A validated policy as the families read it when compiling (agent/policy/families/__init__.py,
    ``CompileSource``): plain data, no pydantic."""

    def __init__(self, policy: Policy, path: str, matrix: Optional[Any],
                 knowledge: Optional[BundleKnowledge] = None) -> None:
        self._policy = policy
        self._bundle_knowledge = knowledge
        self._knowledge: Dict[str, Dict[str, Any]] = {}
        self.path = path
        self.policy: Dict[str, Any] = policy.policy.model_dump()
        self.matrix: Optional[Dict[str, Any]] = matrix.to_compiled() if matrix is not None else None

    def knowledge(self, table: str) -> Dict[str, Any]:
        """One of gpuguard's knowledge tables in use (the package's, or the bundle's where dated later), compiled;
        read once, when first asked (agent/policy/knowledge_files.py)."""
        from agent.policy.knowledge_files import compiled_table

        if table not in self._knowledge:
            try:
                self._knowledge[table] = compiled_table(table, self._bundle_knowledge)
            except InputFileError as exc:
                raise PolicyError(exc.path, [exc.reason]) from None
        return self._knowledge[table]

    def section(self, key: str) -> Any:
        value = getattr(self._policy, key, None)
        if isinstance(value, list):
            return [item.model_dump() for item in value]
        return value.model_dump() if value is not None else None

    def section_or_default(self, key: str) -> Dict[str, Any]:
        found = self.section(key)
        if found is not None:
            return dict(found)
        model = next(t for t in get_args(Policy.model_fields[key].annotation) if t is not type(None))
        return dict(model().model_dump())


def guarded_patterns(policy: Policy) -> List[str]:
    """Package globs the policy guards: what the fail-safe protects when the policy cannot be read, what the
    known-good set holds and what a rollback restores: ``[policy] guarded``, then each family's (agent/policy/
    families/), in the order of their table."""
    source = _Source(policy, "<policy>", None)
    patterns: List[str] = list(policy.policy.guarded)
    for name in FAMILIES:
        patterns += family(name).guarded(source)
    return list(dict.fromkeys(patterns))


def compile_policy(loaded: LoadedPolicy, matrix: Optional[Any] = None, now: Optional[dt.datetime] = None,
                   knowledge: Optional[BundleKnowledge] = None) -> Dict[str, Any]:
    """The plain-JSON form the hook evaluates; ``matrix`` (a Matrix) is required when the policy asks for it;
    ``knowledge``: the bundle in force's knowledge files (None: the package's tables only). The policy-wide fields
    here, each family's section by the family (agent/policy/families/), in table order."""
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
    }
    source = _Source(policy, loaded.path, matrix, knowledge)
    # The TheRock release table always (explain and the [amd] family report a release newer than it); a family's
    # own tables merged in beside it (the companions rule's dcgm-exporter table).
    tables: Dict[str, Any] = {THEROCK_RELEASES_TABLE: source.knowledge(THEROCK_RELEASES_TABLE)}
    for name in FAMILIES:
        compiled = family(name).compiled(source)
        tables.update(compiled.get("knowledge") or {})
        data.update({key: value for key, value in compiled.items() if key != "knowledge"})
    data["knowledge"] = tables
    if policy.health:
        data["health"] = policy.health.model_dump()
    check_compiled(json.loads(json.dumps(data)), "<compiled>")
    return data


def compiled_from(loaded: LoadedPolicy, matrix: Optional[Any] = None,
                  knowledge: Optional[BundleKnowledge] = None) -> CompiledPolicy:
    """Compile in memory (``policy explain``, the rollback watcher, tests)."""
    return CompiledPolicy(json.loads(json.dumps(compile_policy(loaded, matrix, knowledge=knowledge))), loaded.path)


def load_and_compile(path: str = DEFAULT_POLICY_DIR, matrix_path: Optional[str] = None,
                     knowledge: Optional[BundleKnowledge] = None) -> Tuple[LoadedPolicy, CompiledPolicy]:
    """Load a policy and compile it, loading the AMD matrix only when the policy requires it and the knowledge
    tables only when a rule reads them."""
    loaded = load_policy(path)
    matrix = None
    if loaded.policy.policy.require_amd_matrix:
        from agent.policy.matrix import load_matrix

        matrix = load_matrix(matrix_path)
    return loaded, compiled_from(loaded, matrix, knowledge)


def write_compiled(path: str, compiled: CompiledPolicy) -> None:
    """Write the compiled policy atomically (the hook may read it at any moment)."""
    from agent.files import write_atomically

    write_atomically(path, json.dumps(compiled.data, indent=2, sort_keys=True) + "\n")
