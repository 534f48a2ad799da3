# gpuguard's dnf4 plugin: refuse a resolved transaction that breaks the GPU driver/ROCm pairing policy.
#
# Installed as <python3 sitelib>/dnf-plugins/gpuguard.py (RHEL 8: python3.6, RHEL 9: python3.9) with its config in
# /etc/dnf/plugins/gpuguard.conf. It runs inside dnf's own Python, so it imports only the standard library and
# dnf, and stays Python 3.6-compatible: it does not import the agent. In resolved() (after depsolve, before any
# download or the confirmation prompt) it serialises the transaction and the installed set as JSON, runs the
# checker (/usr/lib/gpuguard/gpuguard-dnf-check, the agent's stdlib-only code on the system python3) with
# --root <installroot>, echoes its lines and, when it refuses, raises dnf.exceptions.Error with its message: dnf
# then prints "Error: gpuguard: REFUSED (...)", exits 1 and changes nothing.
#
# dnf only re-raises dnf.exceptions.Error from a plugin; any other exception is logged and the transaction goes
# ahead. So every failure here (a bug, a checker that hangs or crashes, unreadable output) is converted into
# dnf.exceptions.Error: fail closed, with a one-line bypass hint (--disableplugin=gpuguard). The one exception is
# a checker that is not installed at all (a broken or half-removed gpuguard): like the apt hook's launcher, the
# plugin warns and lets the transaction through, so that the repair (dnf reinstall gpuguard) is never blocked.

import json
import os
import shlex
import signal
import subprocess
import sys

import dnf
import dnf.exceptions
import dnf.transaction

DEFAULT_CHECKER = "/usr/lib/gpuguard/gpuguard-dnf-check"
DEFAULT_TIMEOUT_SECONDS = 60.0
BYPASS = ("to bypass the guard for one run (audited nowhere; prefer an override window): "
          "dnf --disableplugin=gpuguard ...")
REQUEST_FORMAT = 1


def _actions(*names):
    return frozenset(getattr(dnf.transaction, n) for n in names if hasattr(dnf.transaction, n))


# Packages coming onto the system, and packages leaving it (REINSTALLED: the old copy of a reinstalled NEVRA).
INBOUND = _actions("PKG_INSTALL", "PKG_UPGRADE", "PKG_DOWNGRADE", "PKG_REINSTALL", "PKG_OBSOLETE")
OUTBOUND = _actions("PKG_UPGRADED", "PKG_DOWNGRADED", "PKG_REINSTALLED", "PKG_OBSOLETED", "PKG_REMOVE",
                    "PKG_ERASE")


def _ignore_sigpipe():
    """Ignore SIGPIPE; return the previous handler (None when signals cannot be changed here)."""
    try:
        return signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    except (ValueError, OSError, AttributeError):  # not the main thread, or no SIGPIPE on this platform
        return None


def _restore_sigpipe(previous):
    if previous is not None:
        signal.signal(signal.SIGPIPE, previous)


def _package(pkg):
    return {"name": pkg.name, "epoch": int(pkg.epoch or 0), "version": pkg.version, "release": pkg.release,
            "arch": pkg.arch}


def _action_name(tsi):
    try:
        return str(tsi.action_name)
    except Exception:  # noqa: BLE001 - only used in messages
        return str(tsi.action)


class GpuGuard(dnf.Plugin):
    """Runs gpuguard's checker on every resolved transaction and refuses the ones it refuses."""

    name = "gpuguard"

    def __init__(self, base, cli):
        super(GpuGuard, self).__init__(base, cli)
        self.checker = DEFAULT_CHECKER
        self.timeout_seconds = DEFAULT_TIMEOUT_SECONDS
        self.config_problem = None

    def config(self):
        try:
            conf = self.read_config(self.base.conf)
            if conf.has_option("main", "checker") and conf.get("main", "checker").strip():
                self.checker = conf.get("main", "checker").strip()
            if conf.has_option("main", "timeout"):
                self.timeout_seconds = float(conf.get("main", "timeout"))
        except Exception as exc:  # noqa: BLE001 - reported (and refused) in resolved(), where dnf honours it
            self.config_problem = "%s: %s" % (type(exc).__name__, exc)

    def resolved(self):
        try:
            self._check()
        except dnf.exceptions.Error:
            raise
        except Exception as exc:  # noqa: BLE001 - dnf would only log it and go ahead: fail closed instead
            raise dnf.exceptions.Error("gpuguard: REFUSED by fail-safe: the dnf plugin failed (%s: %s); %s"
                                       % (type(exc).__name__, exc, BYPASS)) from exc

    # --- the check ---------------------------------------------------------------------------------------------

    def _check(self):
        if self.config_problem:
            raise dnf.exceptions.Error("gpuguard: REFUSED: bad /etc/dnf/plugins/gpuguard.conf (%s); %s"
                                       % (self.config_problem, BYPASS))
        transaction = self.base.transaction
        if transaction is None:
            return
        items = []
        for tsi in transaction:
            if tsi.action in INBOUND:
                direction = "in"
            elif tsi.action in OUTBOUND:
                direction = "out"
            else:
                continue  # reason changes and the like move no files
            item = _package(tsi.pkg)
            item.update(direction=direction, action=_action_name(tsi))
            items.append(item)
        if not items:
            return
        request = {"format": REQUEST_FORMAT, "tool": "dnf", "command_line": self._command_line(),
                   "installonly": self._installonly_names(), "items": items,
                   "installed": [_package(p) for p in self.base.sack.query().installed()]}
        self._run_checker(json.dumps(request).encode("utf-8"))

    def _command_line(self):
        argv = list(sys.argv or [])
        if not argv:
            return None
        return " ".join([os.path.basename(argv[0])] + argv[1:])

    def _installonly_names(self):
        try:
            query = self.base.sack.query().filter(provides=list(self.base.conf.installonlypkgs))
            return sorted(set(p.name for p in query))
        except Exception:  # noqa: BLE001 - the checker knows the usual kernel names anyway
            return []

    def _run_checker(self, payload):
        argv = shlex.split(self.checker) + ["--root", self.base.conf.installroot or "/"]
        if not os.path.exists(argv[0]):
            sys.stderr.write("gpuguard: warning: the checker %s is not installed; this transaction is NOT checked: "
                             "reinstall gpuguard\n" % argv[0])
            return
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            raise dnf.exceptions.Error("gpuguard: REFUSED by fail-safe: cannot run the checker %s (%s); %s"
                                       % (argv[0], exc.strerror or exc, BYPASS)) from exc
        # dnf resets SIGPIPE to its default action when stdout is not a terminal, so a checker that exits
        # before reading its stdin would kill dnf itself (exit -13, no message). Ignore SIGPIPE while we
        # write: communicate() then sees EPIPE, and the refusal below names the checker's exit status.
        previous = _ignore_sigpipe()
        try:
            out, err = proc.communicate(payload, timeout=self.timeout_seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise dnf.exceptions.Error("gpuguard: REFUSED by fail-safe: the checker did not answer within %g s; %s"
                                       % (self.timeout_seconds, BYPASS)) from None
        finally:
            _restore_sigpipe(previous)
        lines = [ln for ln in (err + out).decode("utf-8", "replace").splitlines() if ln.strip()]
        if proc.returncode == 0:
            for line in lines:
                sys.stderr.write(line + "\n")
            return
        if not any("REFUSED" in ln for ln in lines):
            lines.append("gpuguard: REFUSED by fail-safe: the checker exited %s without a decision; %s"
                         % (proc.returncode, BYPASS))
        # dnf prefixes the message with "Error: ": the REFUSED lines go first, so it lands on a refusal and not on
        # a warning or note printed before it (the order among each kind is kept)
        lines.sort(key=lambda ln: "REFUSED" not in ln)
        raise dnf.exceptions.Error("\n".join(lines))
