"""node-feature-discovery's ``local`` source: the gpuguard labels as one file in ``features.d/``.

NFD reads every file in ``/etc/kubernetes/node-feature-discovery/features.d/`` (dot-files excepted), one
``<namespace>/<name>=<value>`` per line; a ``# +expiry-time=<RFC3339>`` line makes the lines after it lapse at that
time, so a dead agent's labels go away by themselves. A file is read whole, up to 64 kB. The renderer is pure; the
writer writes ``.gpuguard...`` beside the target and renames it, so NFD never reads half a file.

Labels (namespace ``gpuguard.io``; values are Kubernetes label values, see :func:`label_value`):
    compliant        true | false | unknown (no policy, or not evaluated yet)
    policy           the compiled policy's name ([policy] name)
    violations       rules the installed stack violates (only when not compliant)
    health           pass, regression, cpu_fallback, failed, timeout, skipped, busy, deferred
    health-ok        true (pass, busy) | false (regression, cpu_fallback, failed, timeout); absent otherwise
    health-at        when the last health check finished, ``20261203T155737Z``
    kernel, amdgpu-driver, rocm, nvidia-driver, cuda, os       the pairing (each only when known)
    gpu-count        GPUs in the last snapshot
    reboot-needed    true when the next boot kernel differs, an installed driver is not the loaded one, or a
                     rollback moved kernel module packages since the last boot
    rollback-restorable  true when a rollback can restore every guarded package exactly (rollback-coverage.json),
                     false when some cannot be restored or only inexactly; absent before any known-good set
    rollback-coverage    ``33-of-33``: guarded packages restorable, of the known-good set's
    snapshot-at      when the last snapshot was taken
    agent-version    the gpuguard version
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

from agent.files import write_atomically
from agent.integrations.reboot import REBOOT_FINDINGS
from agent.report.plain import PlainPairing
from agent.wire import FAILED_HEALTH_STATUSES, PASSED_HEALTH_STATUSES

NAMESPACE = "gpuguard.io"
MAX_FILE_BYTES = 64 * 1024  # NFD reads at most this much of one features file
MAX_LABEL_VALUE_CHARS = 63

_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-_.A-Za-z0-9]*[A-Za-z0-9])?)?")
_NOT_LABEL_CHARS = re.compile(r"[^-_.A-Za-z0-9]+")
_EDGE_CHARS = "-_."


@dataclass(frozen=True)
class NfdView:
    """What the features file shows, gathered by the daemon from its state."""

    agent_version: str
    compliant: Optional[bool] = None
    policy: Optional[str] = None
    violated_rules: int = 0
    pairing: Optional[PlainPairing] = None
    snapshot_at_seconds: Optional[float] = None
    finding_kinds: Tuple[str, ...] = ()
    health_status: Optional[str] = None
    health_at_seconds: Optional[float] = None
    rollback_needs_reboot: bool = False  # a rollback moved kernel module packages and the host has not rebooted
    rollback_guarded: Optional[int] = None  # the known-good set's guarded packages (None: none recorded)
    rollback_restorable: Optional[int] = None  # of them, restorable from a kept file
    rollback_exact: Optional[bool] = None  # every kept file exact


def is_label_value(value: str) -> bool:
    """True for a valid Kubernetes label value: empty, or at most 63 characters of [-_.A-Za-z0-9] with an
    alphanumeric first and last character."""
    return len(value) <= MAX_LABEL_VALUE_CHARS and _LABEL_VALUE.fullmatch(value) is not None


def label_value(text: str) -> str:
    """``text`` made a valid label value: other characters become ``_`` ("+" becomes "_", " " too), the ends are
    trimmed to alphanumerics, the length cut to 63 (and trimmed again). Empty when nothing label-safe is left."""
    value = _NOT_LABEL_CHARS.sub("_", text).strip(_EDGE_CHARS)
    return value[:MAX_LABEL_VALUE_CHARS].rstrip(_EDGE_CHARS)


def label_time(seconds: float) -> str:
    """A Unix time as a label-safe UTC timestamp (ISO 8601 basic format: ``20261203T155737Z``)."""
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def rfc3339(moment: dt.datetime) -> str:
    """``moment`` in UTC as RFC 3339 with a Z, whole seconds (what NFD's expiry-time parses)."""
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def labels(view: NfdView) -> List[Tuple[str, str]]:
    """The (name, value) pairs for a view, in a fixed order; names without the namespace. Pure."""
    out: List[Tuple[str, str]] = []

    def add(name: str, value: Optional[object]) -> None:
        if value is None:
            return
        text = label_value(str(value).lower() if isinstance(value, bool) else str(value))
        if text:  # an empty value would read as "true" to NFD
            out.append((name, text))

    add("compliant", "unknown" if view.compliant is None else view.compliant)
    add("policy", view.policy)
    if view.compliant is False and view.violated_rules:
        add("violations", view.violated_rules)
    if view.health_status is not None:
        add("health", view.health_status)
        add("health-ok", True if view.health_status in PASSED_HEALTH_STATUSES else False
            if view.health_status in FAILED_HEALTH_STATUSES else None)
    if view.health_at_seconds is not None:
        add("health-at", label_time(view.health_at_seconds))
    p = view.pairing
    if p is not None:
        add("os", f"{p.os_id}-{p.os_version_id}" if p.os_id and p.os_version_id else p.os_id)
        add("kernel", p.kernel_running)
        add("amdgpu-driver", p.amdgpu_loaded)
        add("rocm", p.rocm)
        add("nvidia-driver", p.nvidia_loaded)
        add("cuda", p.cuda_driver_api)
        add("gpu-count", p.gpu_count)
    if view.snapshot_at_seconds is not None or view.rollback_needs_reboot:
        pending = bool(p is not None and p.kernel_next_boot and p.kernel_next_boot != p.kernel_running)
        add("reboot-needed", pending or view.rollback_needs_reboot
            or any(kind in REBOOT_FINDINGS for kind in view.finding_kinds))
    if view.rollback_guarded is not None and view.rollback_restorable is not None:
        add("rollback-restorable", view.rollback_restorable == view.rollback_guarded and bool(view.rollback_exact))
        add("rollback-coverage", f"{view.rollback_restorable}-of-{view.rollback_guarded}")
    if view.snapshot_at_seconds is not None:
        add("snapshot-at", label_time(view.snapshot_at_seconds))
    add("agent-version", view.agent_version)
    return out


def render_features(view: NfdView, expires_at: dt.datetime) -> str:
    """The features.d file for ``view``: the expiry line, then one ``gpuguard.io/name=value`` per label. Pure.

    Lines past NFD's 64 kB are left out whole (no real view comes near it)."""
    lines = [f"# +expiry-time={rfc3339(expires_at)}"]
    size = len(lines[0]) + 1
    for name, value in labels(view):
        line = f"{NAMESPACE}/{name}={value}"
        if size + len(line) + 1 > MAX_FILE_BYTES:
            break
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


def body_of(text: str) -> str:
    """The file without its expiry line: what changes when the state shown changes."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("# +expiry-time="))


def write_features(path: str, text: str) -> bool:
    """Replace the features file atomically; False (nothing written) when its directory does not exist.

    The directory is never created: without it NFD is not set up on this host. The temp file is a dot-file in
    the same directory, which NFD ignores, renamed over the target; on any failure the old file stays.
    """
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        return False
    data = text.encode("utf-8")
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"features file is {len(data)} bytes, NFD reads at most {MAX_FILE_BYTES}")
    write_atomically(path, text)
    return True

