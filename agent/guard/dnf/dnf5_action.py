"""The dnf5 entry: an actions-plugin command (``goal_resolved``, ``mode=json``, ``raise_error=1``) that runs the guard.

dnf5 does not load dnf4's Python plugins. Its actions plugin (libdnf5-plugin-actions) runs
/usr/lib/gpuguard/gpuguard-dnf5-action once per resolved goal (packaging/dnf5/gpuguard.actions) and, in JSON mode,
answers requests the command writes on its stdout (libdnf5-plugins/actions/actions.cpp, actions.8)::

    -> {"op": "get", "domain": "trans_packages", "args": {"output": ["direction", "name", ...]}}
    <- {"op": "reply", "requested_op": "get", "domain": "trans_packages", "status": "OK",
        "return": {"trans_packages": [{"direction": "IN", "name": "rocm-core", ...}, ...]}}

one JSON object per line each way (a reply with ``"status": "ERROR"`` carries ``message``). This command asks for
the transaction packages, the installed packages, the install-only names and ``installroot``, builds the same
request the dnf4 plugin sends (agent/guard/dnf/request.py) and decides with the dnf checker (agent/guard/dnf/check.py):
same lines on stderr, same exit codes. A refusal is also sent to dnf5's logger (``{"op": "log"}``) and ends with a
non-zero exit, which with ``raise_error=1`` makes dnf5 throw and abort the transaction (dnf5 >= 5.2.11.0; older
actions plugins only log it: see docs/guard.md). Every reply is read bounded (MAX_REPLIES_BYTES in all, within
``--input-timeout-seconds``); no usable reply is the fail-safe's input not read whole. Standard library only.
"""

from __future__ import annotations

import datetime as dt
import json
import sys

from agent.guard.dnf import check as dnf_check
from agent.guard.dnf.check import BYPASS_HINTS
from agent.guard.dnf.request import REQUEST_FORMAT
from agent.guard.hotpath import entry
from agent.guard.hotpath.decision import EXIT_USAGE, PREFIX
from agent.guard.hotpath.stream import DEFAULT_TIMEOUT_SECONDS, Reader

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO, Callable, Dict, List, Optional, Sequence, TextIO

PACKAGE_ATTRS = ["name", "epoch", "version", "release", "arch"]
SOURCE = "dnf5 actions plugin"


MAX_REPLIES_BYTES = 64 << 20  # all the replies of one run together, as the dnf4 checker's whole input


class ProtocolError(Exception):
    """The actions plugin's answer was missing, cut short, too large, late, not JSON, or not the reply asked for."""


class Peer:
    """The actions plugin at the other end of our stdout (requests) and stdin (replies); every reply of one run
    is read within MAX_REPLIES_BYTES and ``timeout_seconds`` from the first request."""

    def __init__(self, requests: BinaryIO, replies: BinaryIO,
                 timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.requests = requests
        self.replies = replies
        self.timeout_seconds = timeout_seconds
        self.received: List[str] = []
        self._reader: Optional[Reader] = None

    def _reply_line(self, what: str) -> bytes:
        """The next reply line, whole (ending in a newline); ProtocolError otherwise."""
        if self._reader is None:
            try:
                fd: Optional[int] = self.replies.fileno()
            except (AttributeError, OSError, ValueError):  # an in-memory stream (tests)
                fd = None
            if fd is None:
                line = self.replies.readline(MAX_REPLIES_BYTES + 1)
                problem = f"larger than {MAX_REPLIES_BYTES} bytes" if len(line) > MAX_REPLIES_BYTES else None
            else:
                self._reader = Reader(fd, MAX_REPLIES_BYTES, self.timeout_seconds)
        if self._reader is not None:
            line = self._reader.read_line()
            problem = self._reader.problem
        self.received.append(line.decode("utf-8", errors="replace"))
        if problem:
            raise ProtocolError(f"the reply to the {what} request: {problem}")
        if not line.strip():
            raise ProtocolError(f"no reply to the {what} request (pipe closed)")
        if not line.endswith(b"\n"):
            raise ProtocolError(f"the reply to the {what} request was cut short (no newline)")
        return line

    def call(self, op: str, domain: Optional[str], args: Dict[str, Any]) -> Dict[str, Any]:
        request: Dict[str, Any] = {"op": op, "args": args}
        if domain is not None:
            request["domain"] = domain
        try:
            self.requests.write(json.dumps(request).encode("utf-8") + b"\n")
            self.requests.flush()
        except OSError as exc:
            raise ProtocolError(f"cannot send the {op} {domain or ''} request ({exc.strerror or exc})") from None
        raw = self._reply_line(f"{op} {domain or ''}".strip())
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"reply to the {op} {domain or ''} request: byte {exc.start}: not UTF-8") from None
        try:
            reply = json.loads(line)
        except ValueError as exc:
            raise ProtocolError(f"reply to the {op} {domain or ''} request is not valid JSON ({exc})") from None
        if not isinstance(reply, dict) or reply.get("op") != "reply" or reply.get("requested_op") != op:
            raise ProtocolError(f"unexpected answer to the {op} {domain or ''} request: {line.strip()[:200]!r}")
        if reply.get("status") != "OK":
            why = reply.get("message") or reply.get("status")
            raise ProtocolError(f"the {op} {domain or ''} request failed: {why}")
        return reply

    def get_list(self, domain: str, args: Dict[str, Any]) -> List[Dict[str, Any]]:
        reply = self.call("get", domain, args)
        result = reply.get("return")
        key = "keys_val" if domain == "conf" else domain
        items = result.get(key) if isinstance(result, dict) else None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ProtocolError(f"reply to the get {domain} request has no {key} list")
        return items

    def log(self, level: str, message: str) -> None:
        try:
            self.call("log", None, {"level": level, "message": message})
        except ProtocolError:
            pass  # the message is on stderr anyway


def fetch_request(peer: Peer) -> Dict[str, Any]:
    """Ask the actions plugin for everything the checker needs; the request document of agent/guard/dnf/request.py."""
    trans = peer.get_list("trans_packages", {"output": ["direction", "action"] + PACKAGE_ATTRS})
    installed = peer.get_list("packages", {"output": PACKAGE_ATTRS, "filters": [{"key": "installed"}]})
    installonly = peer.get_list("packages", {"output": ["name"], "filters": [{"key": "installonly"}]})
    conf = peer.get_list("conf", {"key": "installroot"})
    items = []
    for index, pkg in enumerate(trans, 1):
        direction = str(pkg.get("direction", "")).lower()
        if direction not in ("in", "out"):
            raise ProtocolError(f"trans_packages -> {index} -> direction: {pkg.get('direction')!r} is not IN or OUT")
        items.append(dict({k: pkg.get(k) for k in PACKAGE_ATTRS}, direction=direction, action=pkg.get("action")))
    root = next((str(c.get("value")) for c in conf if c.get("key") == "installroot" and c.get("value")), "/")
    return {"format": REQUEST_FORMAT, "tool": "dnf5", "command_line": None, "root": root,
            "installonly": sorted({str(p.get("name")) for p in installonly if p.get("name")}),
            "installed": [{k: p.get(k) for k in PACKAGE_ATTRS} for p in installed], "items": items}


def run(argv: Sequence[str], peer: Peer, err: TextIO, now: Callable[[], dt.datetime]) -> int:
    """One action run: fetch the transaction, decide, report a refusal to dnf5's log; returns the exit code."""
    import io

    try:
        args = dnf_check.parse_args(["--tool", "dnf5", *argv])
    except ValueError as exc:
        err.write(f"{PREFIX}: REFUSED: bad action arguments ({exc}); fix /etc/dnf/libdnf5-plugins/actions.d/"
                  f"gpuguard.actions, or {BYPASS_HINTS['dnf5']}\n")
        return EXIT_USAGE
    lines = io.StringIO()
    peer.timeout_seconds = args.input_timeout_seconds
    try:
        document = fetch_request(peer)
    except ProtocolError as exc:
        # No transaction from dnf5 (garbage, an error, a conversation broken off) is input not read whole, as on
        # apt: the fail-safe decides, and block-guarded refuses it whatever names what was received carries.
        code = dnf_check.check("".join(peer.received), args, lines, now, source=SOURCE, problem=str(exc))
    else:
        if "--root" not in argv:
            args.root = document["root"]
        code = dnf_check.check(json.dumps(document), args, lines, now, source=SOURCE)
    output = lines.getvalue()
    err.write(output)
    if code:
        for line in output.splitlines():
            if "REFUSED" in line:
                peer.log("ERROR", line)
    return code


def main(argv: Optional[Sequence[str]] = None, requests: Optional[BinaryIO] = None,
         replies: Optional[BinaryIO] = None, err: Optional[TextIO] = None,
         now: Optional[Callable[[], dt.datetime]] = None) -> int:
    """Action entry point; returns the exit code and never raises."""
    stream = err if err is not None else sys.stderr
    clock = now or (lambda: dt.datetime.now(dt.timezone.utc))
    peer = Peer(requests if requests is not None else sys.stdout.buffer,
                replies if replies is not None else sys.stdin.buffer)
    return entry.never_raise(lambda: run(sys.argv[1:] if argv is None else argv, peer, stream, clock), stream,
                             BYPASS_HINTS["dnf5"])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
