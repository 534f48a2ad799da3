"""Which policy is compiled: the local policy files or the signed bundle in force (``[guard] policy_source``).

Every command and job that compiles the policy (``policy compile``, ``policy explain``, ``pin apply``, the daemon's
recompile) asks :func:`policy_source`, so the choice is made in one place and named the same way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol, Tuple

from agent.bundle.state import BundleState, read_bundle_state
from agent.statepaths import StatePaths

if TYPE_CHECKING:  # pragma: no cover
    from agent.host import Host
    from agent.policy.companions import ExporterTable
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.knowledge_files import BundleKnowledge
    from agent.policy.load import LoadedPolicy
    from agent.policy.table_unknown import TheRockTable


class PolicySettings(Protocol):
    """The four ``[guard]`` settings that choose and check the policy (agent/guard/settings.py's GuardSettings has
    them): what bundle/ reads of the guard's settings, so that it imports nothing of guard/ (guard/ imports bundle/)."""

    @property
    def policy_path(self) -> str: ...

    @property
    def matrix_path(self) -> Optional[str]: ...

    @property
    def policy_source(self) -> str: ...

    @property
    def keys_dir(self) -> str: ...


@dataclass(frozen=True)
class PolicySource:
    """Where the policy comes from: ``kind`` local or bundle, the real path of its files and of its AMD matrix
    (None: the shipped matrix), the line that names it (``bundle serial 42 from hub, key ABCD...``), and the
    bundle's knowledge tables (None: the package's only; agent/policy/knowledge_files.py chooses per table)."""

    kind: str
    policy_path: str
    matrix_path: Optional[str]
    description: str
    state: Optional[BundleState] = None
    knowledge: Optional["BundleKnowledge"] = None

    def exporter_table(self) -> "ExporterTable":
        """gpuguard's dcgm-exporter table in use under this source (the package's, or the bundle's where dated
        later): what the snapshot, ``policy check`` and ``policy freeze`` judge with, as the compiled policy does."""
        from agent.policy.knowledge_files import exporter_table_in_use

        return exporter_table_in_use(self.knowledge)

    def therock_table(self) -> "TheRockTable":
        """gpuguard's TheRock release table in use under this source (the package's, or the bundle's where dated
        later): what the snapshot reports a newer TheRock release against, as ``policy explain`` does."""
        from agent.policy.knowledge_files import therock_table_in_use

        return therock_table_in_use(self.knowledge)


def describe_bundle(state: BundleState) -> str:
    """``bundle serial 42 from hub, key ABCD...``, or that none is installed."""
    if state.serial is None:
        return "bundle (none installed: gpuguard policy install BUNDLE, or the hub's)"
    return f"bundle serial {state.serial} from {state.source or '?'}, key {state.fingerprint or '?'}"


def policy_source(host: "Host", guard: PolicySettings, state_dir: str) -> PolicySource:
    """The policy source the settings choose, with its paths under the Host's root."""
    if guard.policy_source == "local":
        return PolicySource("local", str(host.path(guard.policy_path)), guard.matrix_path,
                            f"local {guard.policy_path}")
    paths = StatePaths(state_dir)
    state = read_bundle_state(str(host.path(paths.policy_bundle_state)))
    matrix = host.path(paths.policy_bundle_matrix)
    knowledge = host.path(paths.policy_bundle_knowledge_dir)
    from agent.policy.knowledge_files import BundleKnowledge

    return PolicySource("bundle", str(host.path(paths.policy_bundle_policy_dir)),
                        str(matrix) if matrix.is_file() else guard.matrix_path, describe_bundle(state), state,
                        BundleKnowledge(str(knowledge), state.serial) if knowledge.is_dir() and state.serial else None)


def compile_source(source: PolicySource, host: "Host", state_dir: str) -> Tuple["LoadedPolicy", "CompiledPolicy"]:
    """Load and compile the chosen policy, with the deny list in force of ``state_dir`` as its ``denied`` section
    (agent/bundle/deny.py); PolicyError, and for a bundle source with none installed, one saying so."""
    from pathlib import Path

    from agent.bundle.deny import with_denied
    from agent.errors import PolicyError
    from agent.policy.load import load_and_compile

    if source.kind == "bundle" and not Path(source.policy_path).is_dir():
        raise PolicyError(source.policy_path, ['no policy bundle is installed ([guard] policy_source = "bundle"): '
                                               "gpuguard policy install BUNDLE, or let the daemon fetch the hub's"])
    loaded, compiled = load_and_compile(source.policy_path, source.matrix_path, source.knowledge)
    return loaded, with_denied(compiled, host, StatePaths(state_dir))
