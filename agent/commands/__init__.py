"""The ``gpuguard`` command families, one module each, all of one shape.

Each module has ``add_parser(sub)``, which adds its command (and subcommands) to the ``gpuguard`` parser and sets
each leaf's ``handler``, and the handlers themselves: ``handler(args, make_host, out) -> exit code``, raising a
known error (agent/errors.py) for agent/cli.py to print as one line. Building a parser imports only argparse and
the plain defaults (agent/defaults.py); a handler imports what it runs inside its body, so one command loads no
other command's code (tests/test_cli_imports.py).

    snapshot.py   gpuguard snapshot            status.py     gpuguard status
    run.py        gpuguard run                 hub.py        gpuguard hub serve|add-host|add-reader
    job.py        gpuguard _job (internal)     policy.py     gpuguard policy check|compile|explain|freeze
    schema.py     gpuguard schema              pin.py        gpuguard pin apply
    health.py     gpuguard health run          override.py   gpuguard override start|list|end
    maintenance.py  gpuguard maintenance begin|end|status
                                               guard.py      gpuguard guard rollback

    options.py       the options several commands share (--root, --config, --json, --output, ...)
    guard_inputs.py  what policy, pin, override and guard act on: settings, state files, the policy, the
                     installed guarded packages
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, TextIO

if TYPE_CHECKING:
    import argparse

    from agent.host import Host

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]
    HostFactory = Callable[[str], Host]
    Handler = Callable[[argparse.Namespace, HostFactory, TextIO], int]

    class CommandFamily(Protocol):
        """A module of this package, as agent/cli.py's table uses it."""

        def add_parser(self, sub: Subparsers) -> None: ...
