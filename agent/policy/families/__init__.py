"""The policy's rule families, one module each, their ordered table, and what they share: the state judged, a
violation, and the lookups over the installed sets.

A family's module (``<name>.py``, its name the compiled policy's section key) holds everything of the family that
needs no pydantic: the host facts it reads (``facts``), its check (``check``), its ``gpuguard policy explain`` lines
(``explain``), its compiled form (``compiled``), the package globs it guards (``guarded``), the shape check of its
part of a compiled document (``shape``) and its ``gpuguard policy freeze`` lines (``freeze``, placed by
``FREEZE_PLACE``): the protocol ``Family`` of agent/policy/evaluate.py. :data:`FAMILIES` lists them in the order
they are judged, as agent/collectors/__init__.py lists the collectors; evaluate.py, load.py, compiled.py,
explain.py and freeze.py loop over it, and a policy without a family's section neither imports nor runs it. The
section's pydantic model, where the family has a TOML section, is agent/policy/sections/<name>.py, which the hook
never imports. These modules are on the apt hook's path: standard library and agent/policy only, records rather
than dataclasses (the shared part lives here rather than in a module of its own: one module fewer to import on
every apt run); what compiling or freezing needs beyond that is imported inside the function. CONTRIBUTING.md ("A
new rule family") lists what a new family touches.
"""

from __future__ import annotations

from agent.hostfacts.package_keys import package_name
from agent.policy import releases
from agent.policy.globs import any_glob
from agent.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Protocol, Sequence, Set, Tuple

    from agent.hostfacts.context import HostContext
    from agent.policy.companions import ExporterTable

    class CompileSource(Protocol):
        """A policy as validated, in plain data: what a family's ``compiled`` and ``guarded`` read (agent/policy/
        load.py builds it from the pydantic model)."""

        @property
        def path(self) -> str:
            """The policy file or directory, for errors."""

        @property
        def policy(self) -> Mapping[str, Any]:
            """The ``[policy]`` section, its defaults filled in."""

        @property
        def matrix(self) -> Optional[Mapping[str, Any]]:
            """AMD's compatibility matrix in its compiled form, when it was loaded."""

        def knowledge(self, table: str) -> Dict[str, Any]:
            """One of gpuguard's knowledge tables in use, compiled (its compiled form, with its origin); read from
            disk when first asked, so only the tables a policy needs are read."""

        def section(self, key: str) -> Any:
            """A family's section as validated (dicts and lists, defaults filled in); None when the policy has
            none (an empty list for a list of rules)."""

        def section_or_default(self, key: str) -> Dict[str, Any]:
            """The section as validated, or as its model reads with nothing set when the policy has none."""

    class FreezeStack(Protocol):
        """The installed packages sorted by the rule that pins them (agent/policy/freeze.py sorts them)."""

        @property
        def kernels(self) -> Mapping[str, Tuple[str, str]]:
            """Kernel release -> (package key, version)."""

        @property
        def amd_driver(self) -> Optional[str]: ...

        @property
        def amd_firmware(self) -> Optional[str]: ...

        @property
        def rocm(self) -> Mapping[str, str]: ...

        @property
        def amd_other(self) -> Mapping[str, str]: ...

        @property
        def nvidia_parts(self) -> Mapping[str, str]: ...

        @property
        def cuda(self) -> Mapping[str, str]: ...

        @property
        def gpu_other(self) -> Mapping[str, str]: ...

    class FreezeHost(Protocol):
        """What ``policy freeze`` read of the host, sorted, and the writers of commented TOML lines (agent/policy/
        freeze.py builds it; the families' ``freeze`` read it)."""

        @property
        def installed(self) -> Mapping[str, str]: ...

        @property
        def context(self) -> HostContext: ...

        @property
        def point_releases(self) -> bool: ...

        @property
        def kernel_series(self) -> bool: ...

        @property
        def stack(self) -> FreezeStack: ...

        @property
        def kernels(self) -> Sequence[Tuple[str, str]]:
            """The ``[kernel] allow`` entries: (release or series glob, why)."""

        @property
        def inconsistent(self) -> Sequence[str]:
            """What differs between installed and loaded (frozen with ``--accept-inconsistent``)."""

        @property
        def amd(self) -> bool:
            """Whether the freeze pins the amdgpu driver and ROCm."""

        @property
        def exporter_table(self) -> ExporterTable:
            """gpuguard's dcgm-exporter table in use (agent/policy/knowledge_files.py)."""

        @property
        def nvidia(self) -> bool:
            """Whether the freeze pins the NVIDIA driver and CUDA."""

        def line(self, key: str, value: object, comment: str) -> str:
            """``key = value  # comment``."""

        def array(self, key: str, items: Sequence[Tuple[str, str]], comment: str) -> List[str]:
            """A multi-line array, one commented item per line."""

        def spec(self, values: Sequence[str]) -> object:
            """One value, or the list of the distinct values."""

        def listing(self, found: Mapping[str, str], limit: int = 3) -> str:
            """``name version, name version and N more``."""

        def names(self, found: Mapping[str, str]) -> List[Tuple[str, str]]:
            """(package name, version) of each key, once per name and version, in key order."""

# The rule families in the order they are judged (and a violation is reported): each name is a module of this
# package and the compiled policy's section key it judges. The one table of families: agent/policy/evaluate.py,
# load.py, compiled.py, explain.py, freeze.py and model.py (with agent/policy/sections/) loop over it.
FAMILIES: Tuple[str, ...] = ("denied", "frozen", "amd", "kernel", "nvidia", "versions", "matrix", "companions",
                              "containers", "workloads", "bake")

OVERRIDE_HINT = 'or open an audited maintenance window: gpuguard override start --minutes 60 --reason "..."'


def no_facts(policy: Any) -> Tuple[str, ...]:
    """No host fact: the rule reads the installed sets only (the ``facts`` of a family that reads none)."""
    return ()


class HostState(Record):
    """The installed packages before and after a change (mappings keyed ``name``, ``name:arch`` for foreign
    arches), the version scheme (``dpkg`` or ``rpm``) and the host's context: the OS and GPU targets AMD's matrix
    is checked against, and the loaded GPU kernel modules (a driver that no package carries, the .run installer or
    a VM or container host's driver, is judged by the module that is running). Every caller reads the context with
    ``read_host_context(root, facts_used(policy))``; None when the policy's rules read no host fact (the apt hook
    then imports no part of agent.hostfacts.context).

    Records rather than dataclasses: this module is on the apt hook's start-up path.
    """

    __slots__ = ("before", "after", "manager", "context")
    before: Mapping[str, str]
    after: Mapping[str, str]
    manager: str
    context: Optional[HostContext]

    def __init__(self, before: Mapping[str, str], after: Mapping[str, str], manager: str = "dpkg",
                 context: Optional[HostContext] = None) -> None:
        Record.__init__(self, before, after, manager, context)

    @classmethod
    def standing(cls, installed: Mapping[str, str], manager: str = "dpkg",
                 context: Optional[HostContext] = None) -> "HostState":
        """An installed set judged as it stands (before and after the same): what violates the policy already."""
        return cls(dict(installed), dict(installed), manager, context)

    def changed(self) -> Set[str]:
        """Package keys whose version differs between before and after (installed, removed or moved)."""
        keys = set(self.before) | set(self.after)
        return {k for k in keys if self.before.get(k) != self.after.get(k)}


class Violation(Record):
    """One broken rule: its name, action, message, the packages involved (name -> version or move), a hint on how
    to proceed and the pinned pairing it breaks (if any)."""

    __slots__ = ("rule", "action", "message", "packages", "hint", "pairing")
    rule: str
    action: str
    message: str
    packages: Mapping[str, str]
    hint: str
    pairing: Optional[str]

    def __init__(self, rule: str, action: str, message: str, packages: Optional[Mapping[str, str]] = None,
                 hint: str = "", pairing: Optional[str] = None) -> None:
        Record.__init__(self, rule, action, message, {} if packages is None else packages, hint, pairing)

    def touches(self, keys: Iterable[str]) -> bool:
        """Whether any of the given package keys is involved in this violation."""
        return self.touches_names({k.split(":", 1)[0] for k in keys})

    def touches_names(self, bases: Set[str]) -> bool:
        """Whether any package involved has one of these names (keys without ``:arch``)."""
        return any(p.split(":", 1)[0] in bases for p in self.packages)

    def to_dict(self) -> Dict[str, Any]:
        return {"rule": self.rule, "action": self.action, "message": self.message, "packages": dict(self.packages),
                "hint": self.hint, "pairing": self.pairing}


class _Index:
    """One installed set's keys with their package names, sorted, and ``{package name: version}`` of the first key
    of each name (as a scan in key order would find it)."""

    __slots__ = ("named_keys", "by_base")

    def __init__(self, mapping: Mapping[str, str]) -> None:
        self.named_keys = sorted((key, package_name(key)) for key in mapping)
        self.by_base: Dict[str, str] = {}
        for key, version in mapping.items():
            self.by_base.setdefault(package_name(key), version)


# One index per installed set, kept only while evaluate() runs (the sets do not change during one evaluation):
# find is called per violation, and a scan of the whole set each time made a 10,000-violation transaction
# quadratic (27 s in the hook); matching runs once per rule over the same sets.
_INDEXES: List[Tuple[Mapping[str, str], _Index]] = []


def indexing(state: HostState) -> None:
    """Index the state's two installed sets until :func:`forget_indexes` (evaluate() brackets its run)."""
    _INDEXES[:] = [(state.before, _Index(state.before)), (state.after, _Index(state.after))]


def forget_indexes() -> None:
    """Drop the indexes :func:`indexing` made."""
    _INDEXES.clear()


def _index(mapping: Mapping[str, str]) -> _Index:
    for cached, index in _INDEXES:
        if cached is mapping:
            return index
    return _Index(mapping)


def by_base(mapping: Mapping[str, str]) -> Dict[str, str]:
    """``{package name: version}`` of an installed set, the first key of each name."""
    return _index(mapping).by_base


def find(mapping: Mapping[str, str], name: str) -> Optional[str]:
    """The version of a package key, or of the first key with that package name; None when absent."""
    if name in mapping:
        return mapping[name]
    return by_base(mapping).get(name)


_GLOBS: Dict[Tuple[str, ...], Callable[[str], bool]] = {}


def matching(mapping: Mapping[str, str], patterns: Sequence[str]) -> List[str]:
    """The keys of an installed set whose package name matches one of the globs, in key order."""
    key = tuple(patterns)
    match = _GLOBS.get(key)
    if match is None:
        if len(_GLOBS) > 64:
            _GLOBS.clear()
        match = _GLOBS[key] = any_glob(key)
    return [k for k, name in _index(mapping).named_keys if match(name)]


def move(state: HostState, name: str) -> str:
    """``old -> new`` of a package for a violation's packages (its version when it did not move)."""
    old, new = find(state.before, name), find(state.after, name)
    if old == new:
        return old or "(absent)"
    return f"{old or '(not installed)'} -> {new or '(removed)'}"


def kernels(mapping: Mapping[str, str], patterns: Sequence[str], manager: str) -> Dict[str, str]:
    """Kernel release -> package key, for kernel image packages in an installed set."""
    out: Dict[str, str] = {}
    for key in matching(mapping, patterns):
        release = releases.kernel_release_of(key, mapping[key], manager=manager)
        if release:
            out[release] = key
    return out

