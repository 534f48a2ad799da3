"""What the ``policy``, ``pin``, ``override`` and ``guard`` commands act on: the agent's settings, the guard's state
files, the policy (from its files, else the compiled copy) and the installed guarded packages; and the exit codes
they share."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Dict, Tuple

from agent.statepaths import StatePaths

if TYPE_CHECKING:  # the commands import their modules lazily, for the CLI's start-up time
    from agent.bundle.source import PolicySource
    from agent.config import Settings
    from agent.host import Host
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.load import LoadedPolicy

EXIT_VIOLATIONS = 10
EXIT_ROLLBACK_FAILED = 14


def settings_of(args: argparse.Namespace) -> Settings:
    """The agent's settings from --config."""
    from agent.config import load_settings

    return load_settings(args.config)


def state_paths(settings: Settings) -> StatePaths:
    """The files of the configured state directory."""
    return StatePaths(settings.agent.state_dir)


def chosen_source(args: argparse.Namespace, host: Host, settings: Settings) -> PolicySource:
    """--policy, else what ``[guard] policy_source`` chooses: the local policy files or the bundle in force."""
    from agent.bundle.source import PolicySource, policy_source

    if getattr(args, "policy", None):
        return PolicySource("local", str(args.policy), settings.guard.matrix_path, f"local {args.policy}")
    return policy_source(host, settings.guard, settings.agent.state_dir)


def policy_path(args: argparse.Namespace, host: Host, settings: Settings) -> str:
    """--policy, else the chosen source's files under --root ([guard] policy_path, or the bundle's policy.d)."""
    return chosen_source(args, host, settings).policy_path


def compile_policy(args: argparse.Namespace, host: Host, settings: Settings) -> Tuple[LoadedPolicy, CompiledPolicy]:
    """The chosen policy's files loaded and compiled."""
    from agent.bundle.source import compile_source

    return compile_source(chosen_source(args, host, settings), host, settings.agent.state_dir)


def policy_for_host(args: argparse.Namespace, host: Host, settings: Settings) -> CompiledPolicy:
    """The policy from the chosen source's files when they are there, else the compiled copy in the state
    directory."""
    from pathlib import Path

    from agent.policy.compiled import read_compiled

    if Path(chosen_source(args, host, settings).policy_path).exists():
        return compile_policy(args, host, settings)[1]
    return read_compiled(str(host.path(state_paths(settings).compiled_policy)))


def installed_versions(host: Host, policy: CompiledPolicy) -> Dict[str, str]:
    """The installed version of each package the policy guards."""
    from agent.guard.installed import read_installed

    return {k: v.version for k, v in read_installed(host, policy.guarded).items()}
