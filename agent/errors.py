"""The one error hierarchy of gpuguard; every known failure is one of these.

    GpuguardError                      exit 1   root; message is one readable line
    ├── UsageError                     exit 2   bad command-line arguments
    ├── ConfigError                    exit 3   config/policy file invalid; lists every problem
    │   └── PolicyError                exit 3   pairing policy invalid
    ├── InputFileError                 exit 4   a data file (snapshot JSON, state) is missing or corrupt
    │   ├── FileMissing                exit 4   the path does not exist (agent/files.py)
    │   ├── InputNotWhole              exit 4   hot-path input not readable as a whole (cut, other protocol, bad bytes)
    │   ├── BundleInvalid              exit 4   a policy bundle file is not one (agent/bundle/format.py)
    │   ├── CertificateInvalid         exit 4   a CA file's certificate is not DER (agent/report/x509_subject.py)
    │   ├── KnowledgeInvalid           exit 4   a knowledge table file is not one (agent/policy/knowledge.py)
    │   └── GateStateDamaged           exit 4   health-gate.json is damaged (agent/guard/rollback/health_gate.py)
    ├── HostReadError                  exit 5   a host path could not be read (permission, I/O)
    ├── StateWriteError                exit 16  a state file could not be written (disk full, read-only): old one kept
    ├── CommandError                   exit 6   an external command failed to start or exited non-zero
    │   ├── CommandNotFound            exit 6   the program is not installed
    │   └── CommandTimeout             exit 6   the program ran past its timeout and was killed
    ├── LibraryUnavailable             exit 7   a GPU library (amdsmi, NVML) cannot be loaded or initialised
    ├── CollectorUnavailable           exit 8   a collector's source is absent on this host ("absent", not broken)
    ├── DeliveryError                  exit 9   the report endpoint did not take a batch (retryable or refused)
    ├── SetupError                     exit 15  the host lacks what gpuguard's set-up makes (the probe's user)
    ├── Interrupted                    exit 1   a wait was given up because the daemon is stopping
    ├── ChildJobFailed                 exit 1   a job child of the daemon failed (agent/daemon_jobs/children.py)
    ├── BundleRefused                  exit 17  a policy bundle was refused (signature, serial, scope, compile)
    └── HubError                       exit 10  the reference hub cannot serve a request
        ├── StoreError                 exit 10  the hub's database failed or refused
        ├── WriterBusy                 exit 10  the hub's write queue is full or shutting down
        └── HubClientError             exit 10  the hub refused a `hub policy` call (agent/hub/client.py)

Foreign exceptions (OSError, subprocess, pydantic, requests, amdsmi, pynvml) are mapped to these once, at the
boundary where they happen; the CLI prints a known error as one line and exits with its code. A class drawn with a
file is defined beside the code that raises it; the others are below.

Exceptions outside the tree, on purpose: each is caught where it is raised (or is a programming error) and never
reaches the CLI.

    SectionInvalid (agent/configfile.py): one settings section's problems, turned into its file's ConfigError
    SpecError (agent/policy/spec.py): a ValueError, so the policy model's validators place it at its field
    ShapeProblem (agent/policy/compiled.py): a rule family's compiled section is misshapen, made the compiled
        policy's InputFileError where it is read
    FreezeRefused (agent/policy/freeze.py): the pure renderer's refusal, which `policy freeze` prints and exits on
    MalformedRecord (agent/daemon_jobs/guard_events.py): a guard-events line the forwarder quarantines and skips
    RecordError (agent/jsonrecord.py): a job child's malformed JSON, made ChildJobFailed or UsageError where read
    ProtocolError (agent/guard/dnf/dnf5_action.py): garbage from dnf5 on the hot path, which the fail-safe decides
    HubHTTPError (agent/hub/responses.py): an HTTP refusal, which the hub app answers with its status and JSON body
    BodyTooLarge (agent/hub/middleware.py): a request body over the limit, answered 413 by the body-size wrapper
    FrozenInstanceError (agent/frozen.py): an AttributeError, as dataclasses' own is: assigning to a frozen record
    TokenRefused (agent/daemon_jobs/hub_probe.py): a token file the lean child leaves to the full child (a ValueError)
    Unsure (agent/daemon_jobs/lean_delivery.py): the stdlib-only delivery child leaves it to the full child
    Down (agent/daemon_jobs/lean_delivery.py): the stdlib-only delivery child's receiver is not serving; backoff

Outcomes that are not errors have exit codes of their own (the hot path's, ``health run``'s, ``status``'s):
docs/architecture.md, "Exit codes", lists them all. tests/test_errors.py checks this docstring against the classes.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Optional, Sequence


class GpuguardError(Exception):
    """Root of every error gpuguard raises on purpose."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(GpuguardError):
    """The command line asks for something that cannot be done."""

    exit_code = 2


class ConfigError(GpuguardError):
    """A config file is invalid; carries every problem found, not just the first."""

    exit_code = 3

    def __init__(self, path: str, problems: Sequence[str]) -> None:
        self.path = path
        self.problems = tuple(problems)
        joined = "; ".join(f"{path}: {p}" for p in self.problems) or f"{path}: invalid"
        super().__init__(joined)


class PolicyError(ConfigError):
    """A pairing policy file is invalid."""


class InputFileError(GpuguardError):
    """A data file given to gpuguard is missing, unreadable or not what it should be."""

    exit_code = 4

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class InputNotWhole(InputFileError):
    """Hot-path input that cannot be read as a whole: cut short, of another protocol version, not text, too large,
    or never ended. No word of it can stand for the transaction, so the fail-safe cannot judge it by its names."""


class HostReadError(GpuguardError):
    """A host file exists but could not be read."""

    exit_code = 5

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot read {path}: {reason}")


class StateWriteError(GpuguardError, OSError):
    """A state file could not be written (ENOSPC, EDQUOT, EROFS, EIO): the old file is kept whole (atomic writes
    replace it only once the new one is on disk; appends add nothing or a line the reader quarantines).

    Also an OSError (``errno``, ``strerror``, ``filename``), so that the daemon's jobs, which treat a failed write as
    a failed run and try again, catch it as before; the CLI prints it as one line and exits 16.
    """

    exit_code = 16

    def __init__(self, path: str, errno_number: Optional[int], reason: str) -> None:
        GpuguardError.__init__(self, f"{path}: cannot be written ({reason}): the old file is kept")
        self.errno = errno_number
        self.strerror = reason
        self.filename = path
        self.path = path
        self.reason = reason

    @classmethod
    def of(cls, path: str, exc: OSError) -> StateWriteError:
        """The error for ``exc`` raised while writing ``path`` (itself when it is one already)."""
        if isinstance(exc, StateWriteError):
            return exc
        return cls(path, exc.errno, exc.strerror or str(exc))


class CommandError(GpuguardError):
    """An external command failed."""

    exit_code = 6

    def __init__(self, argv: Sequence[str], reason: str, returncode: Optional[int] = None) -> None:
        self.argv = tuple(argv)
        self.reason = reason
        self.returncode = returncode
        super().__init__(f"{' '.join(self.argv)}: {reason}")


class CommandNotFound(CommandError):
    """The program to run is not installed."""


class Interrupted(GpuguardError):
    """A wait (for the package manager's lock) was given up because the daemon is stopping."""

    exit_code = 1


class CommandTimeout(CommandError):
    """The program ran past its timeout and was killed."""

    def __init__(self, argv: Sequence[str], timeout_seconds: float) -> None:
        self.timeout_seconds = timeout_seconds
        super().__init__(argv, f"timed out after {timeout_seconds:g} s")


class LibraryUnavailable(GpuguardError):
    """A GPU management library cannot be loaded or initialised."""

    exit_code = 7

    def __init__(self, library: str, reason: str) -> None:
        self.library = library
        self.reason = reason
        super().__init__(f"{library} unavailable: {reason}")


class CollectorUnavailable(GpuguardError):
    """The source a collector reads is absent on this host; recorded as absent, not as an error."""

    exit_code = 8

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class DeliveryError(GpuguardError):
    """The report endpoint did not take a batch of events.

    ``category`` says why: ``unreachable``, ``timeout``, ``tls``, ``server`` (5xx, 429), ``auth`` (401, 403),
    ``endpoint`` (other statuses, redirects, a reply that is not the contract), ``too_large`` (413) or
    ``rejected`` (400, 422: the receiver found the events invalid). ``retryable`` is False only for the last two,
    where sending the same batch again cannot succeed.
    """

    exit_code = 9

    def __init__(self, url: str, category: str, reason: str, status_code: Optional[int] = None) -> None:
        self.url = url
        self.category = category
        self.reason = reason
        self.status_code = status_code
        self.retryable = category not in ("too_large", "rejected")
        super().__init__(f"{url}: {category}: {reason}")


class SetupError(GpuguardError):
    """The host lacks something gpuguard's packages set up (the health probe's user): a set-up step, never a verdict.

    ``remedy`` is the one command line that makes it, as the packages' maintainer scripts do.
    """

    exit_code = 15

    def __init__(self, problem: str, remedy: str) -> None:
        self.problem = problem
        self.remedy = remedy
        super().__init__(f"{problem}; create it as the packages do: {remedy}")


class HubError(GpuguardError):
    """The reference hub cannot serve a request (it answers 503 and the sender retries)."""

    exit_code = 10


class StoreError(HubError):
    """The hub's database failed or refused; the message says which operation."""

    def __init__(self, operation: str, reason: str) -> None:
        self.operation = operation
        self.reason = reason
        super().__init__(f"hub store {operation} failed: {reason}")


class WriterBusy(HubError):
    """The hub's writer queue is full, or it is shutting down."""


class BundleRefused(GpuguardError):
    """A policy bundle was refused: its signature, a serial below the one in force, out of scope, or it does not
    compile; the policy in force keeps guarding. ``kind`` (one of agent/wire.py's REFUSAL_KINDS) is what decides
    and what is counted; ``reason`` is the one line saying why, for people. ``serial`` is the bundle's own, and only
    once its signature was verified (a claim is never kept)."""

    exit_code = 17

    def __init__(self, source: str, reason: str, kind: str, serial: Optional[int] = None) -> None:
        self.source = source
        self.reason = reason
        self.kind = kind
        self.serial = serial
        super().__init__(f"{source}: refused ({kind}): {reason}")
