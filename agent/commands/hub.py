"""``gpuguard hub serve|add-host|add-reader|add-admin|policy``: run the reference hub, make its tokens, manage its
policy bundles."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

from agent.commands.options import add_group, add_hub_config
from agent.defaults import DEFAULT_HUB_CONFIG_PATH

if TYPE_CHECKING:
    from agent.commands import HostFactory, Subparsers
    from agent.hub.settings import HubSettings


def add_parser(sub: Subparsers) -> None:
    hub_sub = add_group(sub, "hub", "the reference central endpoint: receive host reports, answer fleet questions")
    serve = hub_sub.add_parser("serve", help="run the hub (uvicorn) until SIGINT/SIGTERM")
    add_hub_config(serve)
    serve.set_defaults(handler=hub_serve)
    for role, name, what in (("host", "add-host", "HOST_ID"), ("reader", "add-reader", "NAME"),
                             ("admin", "add-admin", "NAME")):
        add = hub_sub.add_parser(name, help=f"make a {role} token, print it once, store only its hash")
        add.add_argument("subject", metavar=what)
        add_hub_config(add)
        add.add_argument("--tokens-file", metavar="PATH", help="tokens file (default: tokens_file of the config)")
        add.add_argument("--rotate", action="store_true", help="replace an existing token (the old one stops "
                                                               "working)")
        add.set_defaults(handler=hub_add, role=role)


def _settings(args: argparse.Namespace) -> HubSettings:
    """The hub's settings: an explicit --config must exist; the default path may be absent (defaults apply)."""
    from agent.hub.settings import load_hub_settings

    return load_hub_settings(args.config or DEFAULT_HUB_CONFIG_PATH, required=args.config is not None)


def hub_serve(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Serve until SIGINT/SIGTERM."""
    from agent.hub.server import serve
    from agent.log import configure

    settings = _settings(args)
    configure(level=settings.log_level)
    serve(settings)
    return 0


def hub_add(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Make a host, reader or admin token: the token on stdout, once; its hash in the tokens file."""
    from agent.hub.tokens import add_token

    tokens_file = args.tokens_file or _settings(args).tokens_file
    token = add_token(tokens_file, args.role, args.subject, rotate=args.rotate)
    out.write(token + "\n")
    print(f"gpuguard: {args.role} token for {args.subject!r} stored (hash only) in {tokens_file}; "
          "it is shown this once", file=sys.stderr)
    return 0
