"""``gpuguard hub serve|add-host|add-reader|add-admin|policy|deny|rollout``: run the reference hub, make its tokens,
manage its policy bundles, its deny list of known-bad versions and the bundles' staged rollouts."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

from agent.commands.options import add_group, add_hub_config, add_json
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
    policy = add_group(hub_sub, "policy", "push, list, show and withdraw the signed policy bundles a hub offers")
    push = policy.add_parser("push", help="store a signed bundle at the hub (admin token); its serial must be new")
    push.add_argument("bundle", metavar="BUNDLE", help="the bundle file (gpuguard policy bundle)")
    push.add_argument("--signature", metavar="SIG", help="its detached OpenPGP signature (default: BUNDLE.sig)")
    push.add_argument("--staged", action="store_true", help="offer it to no host until a staged rollout admits it "
                                                            "(gpuguard hub rollout start); its whole scope once "
                                                            "the rollout is done")
    listing = policy.add_parser("list", help="every bundle the hub stores, newest first")
    show = policy.add_parser("show", help="one bundle: serial, scope, who made and pushed it, its policy files")
    withdraw = policy.add_parser("withdraw", help="stop offering a bundle to hosts (admin token); hosts keep "
                                                  "enforcing what they have")
    for parser in (show, withdraw):
        parser.add_argument("serial", metavar="SERIAL", type=int)
    deny = add_group(hub_sub, "deny", "the signed deny list of known-bad versions every host takes at its next fetch")
    deny_push = deny.add_parser("push", help="put a signed deny list in place at the hub (admin token): a threshold "
                                             "of a fleet-wide policy role of the root; its serial above the one "
                                             "in place")
    deny_push.add_argument("deny", metavar="FILE", help="the deny list (deny.json, format gpuguard-deny/1)")
    deny_push.add_argument("--signature", metavar="SIG", help="its detached OpenPGP signatures (default: FILE.sig)")
    _add_client_options(deny_push)
    deny_push.set_defaults(handler=hub_deny)
    rollout = add_group(hub_sub, "rollout", "roll a pushed bundle out in stages: canaries per cohort, batches, "
                                            "soak, automatic halt")
    start = rollout.add_parser("start", help="start a staged rollout of a pushed bundle (admin token)")
    start.add_argument("serial", metavar="SERIAL", type=int, help="the target bundle's serial")
    start.add_argument("--canaries", type=int, default=1, help="canaries per cohort (default 1)")
    start.add_argument("--batches", default="5,25,100", help="cumulative percentages per cohort after the "
                                                            "canaries (default 5,25,100)")
    start.add_argument("--soak-seconds", type=int, default=600, help="wait per stage after every host passed "
                                                                    "(default 600)")
    start.add_argument("--halt-percent", type=float, default=0.0,
                       help="under the absolute rule, halt when more than this percentage of a batch fails "
                            "(default 0: any failure); any failing canary halts")
    start.add_argument("--judge", choices=("control", "absolute"), default="control",
                       help="control (default): halt when a cohort's admitted hosts fail more than its hosts not "
                            "admitted, by a one-sided Fisher exact test (cohorts too small to test: the absolute "
                            "rule); absolute: any failing canary or more than --halt-percent of a batch halts, "
                            "for small fleets")
    start.add_argument("--report-deadline-seconds", type=int, default=172800,
                       help="an admitted host that has not passed this long after admission fails (silent, dead, "
                            "never changed); default 172800 (two days), 0: wait for it forever")
    start.add_argument("--revert-serial", type=int, default=None, metavar="SERIAL",
                       help="a bundle pushed --staged above the target with the previous policy, signed now: "
                            "abort releases it so admitted hosts go back (the hub cannot sign one then)")
    start.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                       help="take only hosts with this label (repeatable)")
    status = rollout.add_parser("status", help="every rollout, or one with its hosts, stages and evidence")
    status.add_argument("rollout_id", metavar="ROLLOUT", nargs="?")
    actions = []
    for action, what in (("pause", "stop admitting hosts until resumed"), ("resume", "admit again after a pause"),
                         ("abort", "end the rollout and withdraw its target (admin token)")):
        parser = rollout.add_parser(action, help=what)
        parser.add_argument("rollout_id", metavar="ROLLOUT")
        actions.append(parser)
    for parser in (start, status, *actions):
        _add_client_options(parser)
        parser.set_defaults(handler=hub_rollout)
    for parser in (push, listing, show, withdraw):
        _add_client_options(parser)
        parser.set_defaults(handler=hub_policy)


def _add_client_options(parser: argparse.ArgumentParser) -> None:
    """The options every command calling the hub's API takes."""
    parser.add_argument("--hub", metavar="URL", help="the hub's base URL (default: $GPUGUARD_HUB_URL)")
    parser.add_argument("--token-file", metavar="PATH",
                        help="file holding the bearer token, mode 0600 (default: $GPUGUARD_HUB_TOKEN_FILE, "
                             "else the token in $GPUGUARD_HUB_TOKEN)")
    parser.add_argument("--ca-bundle", metavar="PATH", help="CA certificates to verify the hub's TLS with")
    add_json(parser, "print the hub's JSON answer")


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


def hub_policy(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """``hub policy push|list|show|withdraw``: one call to the hub's policy API, its answer printed."""
    import json

    from agent.files import read_bytes_bounded
    from agent.hub.client import HubClient, bundle_lines, bundles_table, hub_token, hub_url
    from agent.wire import MAX_SIGNATURE_BYTES

    env = make_host("/").env
    client = HubClient(hub_url(args.hub, env), hub_token(args.token_file, env), ca_bundle=args.ca_bundle)
    command = args.policy_command
    try:
        if command == "push":
            from agent.bundle.format import MAX_BUNDLE_BYTES

            data = read_bytes_bounded(args.bundle, MAX_BUNDLE_BYTES)
            signature = read_bytes_bounded(args.signature or args.bundle + ".sig", MAX_SIGNATURE_BYTES)
            answer = client.push(data, signature, args.staged)
        elif command == "list":
            answer = client.list()
        elif command == "show":
            answer = client.show(args.serial)
        else:
            answer = client.withdraw(args.serial)
    finally:
        client.close()
    if args.json:
        out.write(json.dumps(answer, indent=2, sort_keys=True) + "\n")
    elif command == "list":
        out.write(bundles_table(answer.get("bundles", [])))
    elif command == "show":
        out.write(bundle_lines(answer.get("summary", {}), answer.get("policy_files", [])))
    else:
        verb = "pushed" if command == "push" else "withdrew"
        out.write(f"{verb} bundle serial {answer.get('serial')} (sha256 {answer.get('sha256')})\n")
    return 0


def hub_deny(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """``hub deny push``: one call to the hub's deny list API, its answer printed."""
    import json

    from agent.bundle.deny import MAX_DENY_BYTES
    from agent.files import read_bytes_bounded
    from agent.hub.client import HubClient, hub_token, hub_url
    from agent.wire import MAX_SIGNATURE_BYTES

    env = make_host("/").env
    data = read_bytes_bounded(args.deny, MAX_DENY_BYTES)
    signature = read_bytes_bounded(args.signature or args.deny + ".sig", MAX_SIGNATURE_BYTES)
    client = HubClient(hub_url(args.hub, env), hub_token(args.token_file, env), ca_bundle=args.ca_bundle)
    try:
        answer = client.push_deny(data, signature)
    finally:
        client.close()
    if args.json:
        out.write(json.dumps(answer, indent=2, sort_keys=True) + "\n")
    else:
        verb = "already in place:" if answer.get("unchanged") else "pushed"
        out.write(f"{verb} deny list serial {answer.get('serial')} ({answer.get('entries')} entries, sha256 "
                  f"{answer.get('sha256')}), signed by {answer.get('signed_by')}\n")
    return 0


def hub_rollout(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """``hub rollout start|status|pause|resume|abort``: one call to the hub's rollout API, its answer printed."""
    import json

    from agent.errors import UsageError
    from agent.hub.client import HubClient, hub_token, hub_url, rollout_lines, rollouts_table

    command = args.rollout_command
    spec = None
    if command == "start":
        try:
            batches = [int(b) for b in args.batches.split(",")]
        except ValueError:
            raise UsageError(f"--batches {args.batches!r}: comma-separated whole percentages, e.g. 5,25,100") \
                from None
        labels = dict(item.partition("=")[::2] for item in args.label)
        if any(not k or not v for k, v in labels.items()):
            raise UsageError("--label: KEY=VALUE")
        spec = {"target_serial": args.serial, "canaries": args.canaries, "batches": batches,
                "soak_seconds": args.soak_seconds, "halt_percent": args.halt_percent,
                "judge": args.judge,
                "report_deadline_seconds": args.report_deadline_seconds, "labels": labels,
                "revert_serial": args.revert_serial}
    env = make_host("/").env
    client = HubClient(hub_url(args.hub, env), hub_token(args.token_file, env), ca_bundle=args.ca_bundle)
    try:
        if spec is not None:
            answer = client.rollout_start(spec)
        elif command == "status":
            answer = client.rollout_status(args.rollout_id)
        else:
            answer = client.rollout_action(args.rollout_id, command)
    finally:
        client.close()
    if args.json:
        out.write(json.dumps(answer, indent=2, sort_keys=True) + "\n")
    elif command == "status" and not args.rollout_id:
        out.write(rollouts_table(answer.get("rollouts", [])))
    elif command in ("start", "status"):
        out.write(rollout_lines(answer))
    else:
        out.write(f"rollout {answer.get('rollout_id')}: {answer.get('state')} ({answer.get('reason')})\n")
    return 0
