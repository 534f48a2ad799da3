"""The wire contract between hub and agent, written once: both agent/hub/ and the agent side import it.

    paths        INGEST_PATH (POST a host's EventBatch), BUNDLE_PATH (GET the policy bundle offered to a host),
                 ROOT_PATH (GET ``?version=N``: root version N and its signatures, 204 when the hub has none),
                 FRESHNESS_PATH (GET the hub's signed freshness statement, 204 when it signs none), DENY_PATH (GET
                 the known-bad versions: the deny list and its signatures, 204 when the hub has none)
    ETag         etag_of(serial): ``"bundle-N"``, what If-None-Match names
    the offer    200 ``{"serial", "bundle", "signature", "rollout", "rollout_id", "state", "admitted_stage"}``; on
                 200, 204 and 304 the same rollout fields as headers (ROLLOUT_*_HEADER). ``rollout`` /
                 ROLLOUT_HEADER is the notice, display text only: nothing decides on it. ``rollout_id``, ``state``
                 (OFFER_ROLLOUT_STATES) and ``admitted_stage`` (None: held back) are what the agent decides on,
                 after :func:`rollout_id_ok`, :func:`rollout_state_ok` and :func:`stage_ok` (a trust boundary)
    limits       MAX_STORED_INT, MAX_SIGNATURE_BYTES, MAX_NOTICE_CHARS, MAX_ROLLOUT_ID_CHARS, MAX_STAGE,
                 MAX_STATE_FILE_BYTES
    health       HEALTH_STATUSES, and the two verdicts over them: PASSED_HEALTH_STATUSES give a held node back,
                 FAILED_HEALTH_STATUSES keep it out, halt a rollout's batch, label a node and colour status
    refusals     REFUSAL_KINDS: why a host refused a policy bundle, as a kind (its sentence is for people only), in
                 the bundle state file, the heartbeat, the hub's host rows, its metric and the dashboard
    unknown      UNKNOWN_TABLES and UNKNOWN_COMPONENTS: a heartbeat's unknown_versions (versions newer than a
                 compatibility table of gpuguard's knows), at most MAX_HEARTBEAT_UNKNOWN_VERSIONS of them, each
                 version at most MAX_UNKNOWN_VERSION_CHARS; the hub counts hosts per table
    clock        CLOCK_SKEW_BOUND_SECONDS: a host whose clock is further than this from the hub's (its heartbeat's
                 time against the hub's receipt, or the agent's clock against the hub's ``Date`` answer) is reported
    workloads    a heartbeat's registered workloads (issue 44): MAX_HEARTBEAT_WORKLOADS of them, names as
                 :func:`workload_name_ok`, stack ids as :func:`stack_id_ok`, descriptions of MAX_STACK_TEXT_CHARS;
                 VERIFIED_STACKS_PATH, the hub's verified-stack list a host caches for its hook

Standard library only and no imports at all: the apt hook's hot path reads MAX_STATE_FILE_BYTES from here.
"""

INGEST_PATH = "/v1/events"
BUNDLE_PATH = "/v1/policy/bundle"
ROOT_PATH = "/v1/policy/root"
FRESHNESS_PATH = "/v1/policy/freshness"
DENY_PATH = "/v1/policy/deny"
# A heartbeat's policy_attention words: the bundle in force expired; the freshness statement is stale or names a
# newer serial this host does not get (a freeze); a package installed here is at a version the deny list in force
# names as known-bad. The policy in force keeps guarding either way.
POLICY_ATTENTION = ("expired", "freshness", "denied")
VERIFIED_STACKS_PATH = "/v1/workloads/verified"
# The compatibility tables a version can be unknown to (agent/policy/table_unknown.py): AMD's matrix, the TheRock
# release table, the dcgm-exporter table; and what the version is of. A heartbeat's unknown_versions items are
# {UNKNOWN_FIELDS}; the hub refuses any other table or component, more than MAX_HEARTBEAT_UNKNOWN_VERSIONS items, or
# a version longer than MAX_UNKNOWN_VERSION_CHARS (422 naming the field).
UNKNOWN_TABLES = ("amd-matrix", "therock", "dcgm-exporter")
UNKNOWN_COMPONENTS = ("rocm", "amdgpu", "gpu", "therock", "dcgm-exporter", "dcgm")
UNKNOWN_FIELDS = ("table", "component", "version", "newest", "dated")
MAX_HEARTBEAT_UNKNOWN_VERSIONS = 32
MAX_UNKNOWN_VERSION_CHARS = 64

# The offer's rollout fields: JSON names on a 200, header names on 200, 204 and 304.
OFFER_NOTICE_FIELD = "rollout"
OFFER_ROLLOUT_ID_FIELD = "rollout_id"
OFFER_STATE_FIELD = "state"
OFFER_STAGE_FIELD = "admitted_stage"
ROLLOUT_HEADER = "X-Gpuguard-Rollout"  # the notice
ROLLOUT_ID_HEADER = "X-Gpuguard-Rollout-Id"
ROLLOUT_STATE_HEADER = "X-Gpuguard-Rollout-State"
ROLLOUT_STAGE_HEADER = "X-Gpuguard-Rollout-Admitted-Stage"
# The states a rollout is offered in (active: the target goes only to admitted hosts).
OFFER_ROLLOUT_STATES = ("running", "paused", "halted")

MAX_SIGNATURE_BYTES = 64 * 1024
# Every whole number the hub stores (serials, counts, sizes, sequences): a signed 64-bit column (SQLite INTEGER,
# PostgreSQL BIGINT) holds 0..MAX_STORED_INT; the hub refuses anything outside at the API (422 naming the field).
MAX_STORED_INT = 2**63 - 1
MAX_NOTICE_CHARS = 300  # the hub cuts its notice here; the agent keeps at most this much
MAX_ROLLOUT_ID_CHARS = 64
MAX_STAGE = 100  # a stage per batch, batches strictly increasing percentages up to 100, after stage 0
# Every JSON state file the agent keeps of the hub's answers and of its hold (bundle state, maintenance.json).
MAX_STATE_FILE_BYTES = 64 * 1024

# Issue 43: the hub decides on its own clock (receipt time); an agent's clock further off than this is reported (the
# hub's host rows, API, dashboard and metric; the agent's status). NTP keeps hosts within milliseconds.
CLOCK_SKEW_BOUND_SECONDS = 300

HEALTH_STATUSES = ("pass", "regression", "cpu_fallback", "failed", "timeout", "skipped", "busy", "deferred")
PASSED_HEALTH_STATUSES = ("pass", "busy")
FAILED_HEALTH_STATUSES = ("regression", "cpu_fallback", "failed", "timeout")
# The phases of a maintenance hold in <state_dir>/maintenance.json (agent/integrations/hold.py writes them, the apt
# hook's agent/guard/hotpath/maintenance.py reads them): draining, held, rebooting (Slurm asked to reboot the node),
# kept (a post-change or post-boot check failed).
MAINTENANCE_PHASES = ("draining", "held", "rebooting", "kept")

# Why a bundle was refused (one enum: a model reads it as ``Literal[REFUSAL_KINDS]``). signature: no good signature
# by a trusted key, or the trusted keys are unsafe; threshold: fewer valid signatures than its role needs; expired:
# the bundle or its metadata has expired; rollback: its serial is not above the one in force; scope: not for this
# host; format: not a well-formed bundle (duplicate keys, unencodable text, a field out of range); compile: its
# policy does not compile; freshness: the hub's freshness statement is missing, expired or contradicts the bundle.
REFUSAL_KINDS = ("signature", "threshold", "expired", "rollback", "scope", "format", "compile", "freshness")
# A heartbeat's registered workloads: at most this many (a host registers a handful), names as [[health.workloads]]
# takes them, a stack as its id (WorkloadStack.id: 16 hex digits) and a description for people, capped.
MAX_HEARTBEAT_WORKLOADS = 32
MAX_WORKLOAD_NAME_CHARS = 64
STACK_ID_CHARS = 16
MAX_STACK_TEXT_CHARS = 300
# The verified list a host caches (GET VERIFIED_STACKS_PATH, host token): its format, how many workloads and stacks
# per workload the hub sends at most (the newest passes first), and its size.
VERIFIED_FORMAT = 1
MAX_VERIFIED_WORKLOADS = 256
MAX_VERIFIED_STACKS = 512
MAX_VERIFIED_BYTES = 1 << 20

_ROLLOUT_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def etag_of(serial: int) -> str:
    """The ETag of the bundle with ``serial`` (a bundle's bytes never change under its serial)."""
    return f'"bundle-{serial}"'


def rollout_id_ok(value: object) -> bool:
    """A rollout id as the hub makes them: 1 to MAX_ROLLOUT_ID_CHARS of ``A-Za-z0-9._-``."""
    return isinstance(value, str) and 0 < len(value) <= MAX_ROLLOUT_ID_CHARS and _ROLLOUT_ID_CHARS.issuperset(value)


def rollout_state_ok(value: object) -> bool:
    """One of the states a rollout is offered in."""
    return isinstance(value, str) and value in OFFER_ROLLOUT_STATES


def stage_ok(value: object) -> bool:
    """A stage number: a whole number (not a bool) in 0..MAX_STAGE."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STAGE


_WORKLOAD_NAME_FIRST = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_WORKLOAD_NAME_CHARS = _WORKLOAD_NAME_FIRST | frozenset("_.-")
_HEX = frozenset("0123456789abcdef")


def workload_name_ok(value: object) -> bool:
    """A registered workload's name: 1 to MAX_WORKLOAD_NAME_CHARS of ``a-z 0-9 _ . -``, a letter or digit first."""
    return (isinstance(value, str) and 0 < len(value) <= MAX_WORKLOAD_NAME_CHARS
            and value[0] in _WORKLOAD_NAME_FIRST and _WORKLOAD_NAME_CHARS.issuperset(value))


def stack_id_ok(value: object) -> bool:
    """A workload stack's id: STACK_ID_CHARS lower-case hex digits."""
    return isinstance(value, str) and len(value) == STACK_ID_CHARS and _HEX.issuperset(value)
