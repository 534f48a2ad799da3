"""One home per fact: a default, a file name or a rule written out in agent/ once, where a test can check it."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

AGENT = Path(__file__).resolve().parents[1] / "agent"


def _docstring_nodes(tree: ast.AST) -> set:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def string_constants(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, text) of every string literal in the file that is not a docstring (f-string parts included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    docstrings = _docstring_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


@functools.lru_cache(maxsize=1)
def agent_constants() -> Tuple[Tuple[str, str], ...]:
    """(``path:line``, text) of every string literal in agent/, docstrings left out, parsed once per run."""
    return tuple((f"{path.relative_to(AGENT.parent)}:{line}", text) for path in sorted(AGENT.rglob("*.py"))
                 for line, text in string_constants(path))


def homes(pattern: str) -> List[str]:
    """``path:line`` of every string literal in agent/ (docstrings left out) that matches ``pattern``."""
    regex = re.compile(pattern)
    return [where for where, text in agent_constants() if regex.search(text)]


def test_string_constants_leave_docstrings_out(tmp_path: Path) -> None:
    """The scanner sees literals and f-string parts, not module, class or function docstrings."""
    source = tmp_path / "sample.py"
    source.write_text('"""/var/lib/x in a docstring."""\n\ndef f(a):\n    """Also /var/lib/x."""\n'
                      '    return "/var/lib/x" + f"{a}/var/lib/x"\n')
    assert [text for _, text in string_constants(source)] == ["/var/lib/x", "/var/lib/x"]


@pytest.mark.parametrize("name", ["policy.compiled.json", "overrides.json", "audit.log", "guard-events.jsonl",
                                  "guard-events.position.json", "guard-events.quarantine.jsonl", "known-good.json",
                                  "known-good.before-change.json", "rollback-authorization.json",
                                  "health-rollback.json", "reboot-required.pkgs", "outbox.sqlite3",
                                  "last-snapshot.json", "health-deferral.json", "health-gate.json", "rollback.dnf",

                                  "check.lock", "baselines.json", "gpuguard.prom", ".result.json",
                                  "workloads-verified.json"])
def test_a_state_file_is_named_only_in_statepaths(name: str) -> None:
    """Each file of the state directory is named in agent/statepaths.py and in no other module's code."""
    found = homes(re.escape(name))
    assert found and all(h.startswith("agent/statepaths.py:") for h in found), found


def test_the_state_directory_default_is_written_only_in_defaults() -> None:
    """"/var/lib/gpuguard" (not /var/lib/gpuguard-probe) is a string in agent/defaults.py and nowhere else."""
    found = homes(r"/var/lib/gpuguard(?![-\w])")
    assert len(found) == 1 and found[0].startswith("agent/defaults.py:"), found


@pytest.mark.parametrize("name", ["amdgpu-dkms", "rocm-core"])
def test_the_amd_package_defaults_are_written_only_in_defaults(name: str) -> None:
    """The AMD driver and ROCm package names the policy, the snapshot and freeze default to live in defaults.py."""
    found = homes(f"^{re.escape(name)}$")
    assert len(found) == 1 and found[0].startswith("agent/defaults.py:"), found


def imported_modules(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def test_the_toml_fallback_is_chosen_only_in_files() -> None:
    """tomllib or the vendored tomli is imported in agent/tomlreader.py (toml_module) and in no other module."""
    found = sorted(str(path.relative_to(AGENT.parent)) for path in AGENT.rglob("*.py")
                   if {"tomllib", "tomli"} & set(imported_modules(path)))
    assert found == ["agent/tomlreader.py"]


def test_the_package_name_of_a_key_is_computed_only_in_package_keys() -> None:
    """The rule ``name:arch`` / ``name@version`` -> ``name`` is written once, agent/hostfacts/package_keys.py."""
    rule = re.compile(r'split\("@", 1\)\[0\]\.split\(":", 1\)\[0\]|split\(":", 1\)\[0\]\.split\("@", 1\)\[0\]')
    found = sorted(str(path.relative_to(AGENT.parent)) for path in AGENT.rglob("*.py")
                   if rule.search(path.read_text(encoding="utf-8")))
    assert found == ["agent/hostfacts/package_keys.py"]


@pytest.mark.parametrize("key,name", [("rocm-core", "rocm-core"), ("libfoo:i386", "libfoo"),
                                      ("kernel@6.1.0-1.el9", "kernel"), ("kernel-core@1:5.14.0-427.el9", "kernel-core"),
                                      ("glibc:i686", "glibc")])
def test_package_name_of_every_key_form(key: str, name: str) -> None:
    """Each key form an installed set uses gives the package name back (an epoch's colon after @ included)."""
    from agent.hostfacts.package_keys import package_name

    assert package_name(key) == name


# --- the wire contract between hub and agent (agent/wire.py) and the default config paths (agent/defaults.py) ---

@pytest.mark.parametrize(("pattern", "home", "count"), [
    (r'"bundle-', "agent/wire.py", 1),  # the ETag form
    (r"^X-Gpuguard-Rollout", "agent/wire.py", 4),  # the rollout notice and its three typed-field headers
    (r"^/v1/events$", "agent/wire.py", 1),  # the ingest path
    (r"^/v1/policy/bundle$", "agent/wire.py", 1),  # the bundle path
    (r"/etc/gpuguard/policy\.d", "agent/defaults.py", 1),
    (r"/etc/gpuguard/keys", "agent/defaults.py", 1),
])
def test_a_contract_string_is_written_once(pattern: str, home: str, count: int) -> None:
    """The ETag form, the rollout header names, the hub's paths and the policy and keys directories are string
    literals in their one home and nowhere else in agent/."""
    found = homes(pattern)
    assert len(found) == count and all(h.startswith(f"{home}:") for h in found), found


def assigned(name: str) -> List[str]:
    """``path:line`` of every assignment to ``name`` (a module or class constant) in agent/."""
    found = []
    for path in sorted(AGENT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found.append(f"{path.relative_to(AGENT.parent)}:{node.lineno}")
    return found


@pytest.mark.parametrize("name", ["MAX_SIGNATURE_BYTES", "MAX_NOTICE_CHARS", "MAX_STATE_FILE_BYTES",
                                  "MAX_ROLLOUT_ID_CHARS", "MAX_STAGE", "INGEST_PATH", "BUNDLE_PATH",
                                  "OFFER_ROLLOUT_ID_FIELD", "OFFER_STATE_FIELD", "OFFER_STAGE_FIELD",
                                  "HEALTH_STATUSES", "FAILED_HEALTH_STATUSES", "PASSED_HEALTH_STATUSES"])
def test_a_wire_limit_or_name_is_assigned_only_in_wire(name: str) -> None:
    """The signature, notice, state-file, rollout id and stage bounds, the paths, the offer's field names and the
    health status sets are assigned in agent/wire.py and nowhere else (the old per-module copies are gone)."""
    assert assigned(name) == [h for h in assigned(name) if h.startswith("agent/wire.py:")] and assigned(name)


@pytest.mark.parametrize("name", ["MAX_STATE_BYTES", "FAILED_HEALTH", "CHECK_FAILED", "CHECK_PASSED",
                                  "HEALTH_NOT_OK", "HEALTH_OK", "ROLLOUT_HEADER", "DEFAULT_KEYS_DIR",
                                  "DEFAULT_POLICY_DIR"])
def test_an_old_copy_is_not_assigned_again(name: str) -> None:
    """The names the copies had are assigned at most once: in agent/wire.py or agent/defaults.py (their home)."""
    found = assigned(name)
    assert len(found) <= 1 and all(h.split(":")[0] in ("agent/wire.py", "agent/defaults.py") for h in found), found


def test_the_failing_health_statuses_are_one_set() -> None:
    """A tuple or set literal holding regression, cpu_fallback, failed and timeout (a failing-health set) is
    written only in agent/wire.py; the probe's typed Literal names the same statuses as wire's HEALTH_STATUSES."""
    import typing

    from agent.health.model import HealthStatus
    from agent.wire import FAILED_HEALTH_STATUSES, HEALTH_STATUSES

    failing = set(FAILED_HEALTH_STATUSES)
    found = []
    for path in sorted(AGENT.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        slices = {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)}  # Literal[...] is a type
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.Set, ast.List)) and id(node) not in slices and failing <= {
                    e.value for e in node.elts if isinstance(e, ast.Constant)}:
                found.append(f"{path.relative_to(AGENT.parent)}:{node.lineno}")
    assert found and all(h.startswith("agent/wire.py:") for h in found), found
    assert typing.get_args(HealthStatus) == HEALTH_STATUSES


def class_names(paths: List[Path]) -> dict:
    """Class name -> the files that define a class of that name."""
    found: dict = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(str(path))
    return found


def test_a_shared_class_name_is_found(tmp_path: Path) -> None:
    """The class-name scan reports a name two files define (so the test below can fail)."""
    (tmp_path / "a.py").write_text("class Offer:\n    pass\n")
    (tmp_path / "b.py").write_text("class Offer(object):\n    pass\n\nclass Other:\n    pass\n")
    shared = {name: files for name, files in class_names(sorted(tmp_path.glob("*.py"))).items() if len(files) > 1}
    assert list(shared) == ["Offer"] and len(shared["Offer"]) == 2


def test_each_class_name_means_one_thing() -> None:
    """No two classes in agent/ share a name (the hub's host row is HostRow, not the evaluator's HostState; the
    rollout's StageStep, not the guard's Decision; the hub's OfferedBundle, not the fetch's FetchOutcome)."""
    shared = {name: files for name, files in class_names(sorted(AGENT.rglob("*.py"))).items() if len(files) > 1}
    assert shared == {}
