"""Every file gpuguard keeps in its state directory, named once.

:class:`StatePaths` gives each file's host path (absolute, before any root prefix: a caller with a Host puts it
under ``host.path``, the hot path under ``--root``). Who writes and who reads each file:

============================  ============================================  ==========================================
file                          written by                                    read by
============================  ============================================  ==========================================
policy.compiled.json          gpuguard policy compile, pin apply            the hook, the checkers, every judgement
overrides.json                gpuguard override                             the hook, rollback, policy explain
audit.log                     the hook, override, rollback (appends)        operators
guard-events.jsonl            the hook, the checkers, rollback (appends)    the daemon's guard job, gpuguard status
guard-events.position.json    the daemon's guard-event forwarder            the same
guard-events.quarantine.jsonl the forwarder (lines it could not send)       operators
known-good.json               rollback (the last compliant set)             rollback
known-good.before-change.json rollback (the set before a compliant change)  the health-gated rollback
rollback-authorization.json   rollback, while it runs apt or dnf            the hook, the checkers
health-rollback.json          the health-gated rollback                     the same (never twice to one set)
reboot-required, .pkgs        rollback (a kernel module package moved)      gpuguard status, the NFD labels
debs/, rpms/                  rollback (the known-good package files)       rollback
rollback-coverage.json        rollback (how many guarded packages it can    gpuguard status, the heartbeat, metrics,
                              restore, and from what)                       the NFD labels
rollback.dnf                  rollback on rpm hosts (a dnf shell script)    dnf
outbox.sqlite3                the daemon and its children                   the daemon's delivery, gpuguard status
last-snapshot.json            the snapshot job                              the daemon at start, gpuguard status
health-deferral.json          the daemon's health schedule                  the same, gpuguard status
health-gate.json              the guard and health jobs (the last set that  the health gate, gpuguard status
                              passed, the package changes since)
maintenance.json              the maintenance hand-off (integrations/)      the same, the hook, the checkers, status
health/last.json              the health check                              the daemon at start, gpuguard status
health/baselines.json         the health check                              the same
health/check.lock             whoever runs a health check (flock, holder)   the next check (waits, own probe)
metrics/gpuguard.prom         the metrics job (when no textfile is set)     node_exporter, gpuguard status
cache/<name>.json             the collectors' fact cache                    the same
policy-bundle/                policy install, the daemon's bundle fetch     policy compile, status, the heartbeat
workloads-verified.json       the daemon's policy fetch (the hub's list of  the hook's [workloads] rule, policy
                              verified stacks)                              explain
tls-anchors/<sha256>/         the policy fetch and delivery children (the   the lean child's TLS trust (capath)
                              CA file's certificates as <hash>.<n> files)
.job-<job>.<run>.result.json  a daemon job child (<run>: the daemon's pid  the daemon (leftovers: removed at start)
                              and a count: one file per child)
============================  ============================================  ==========================================

policy-bundle/ holds the signed policy bundle in force (bundle.json, bundle.json.sig), its policy files extracted
(policy.d/), its matrix (amd-compat-matrix.toml, when it carries one) and its knowledge tables (knowledge/<table>.toml,
when it carries any: agent/policy/knowledge_files.py), and state.json (the serial in force, the
signing key, where it came from, the last refusal).

Files beside one of these carry its name with a suffix given where they are made (the outbox's ``.hwm`` high-water
mark, SQLite's ``-wal``, the baselines' ``.baselines.lock``).

Standard library only, importing nothing but :mod:`agent.defaults`: the apt hook builds one.
"""

from __future__ import annotations

from agent.defaults import DEFAULT_STATE_DIR


class StatePaths:
    """Host paths (absolute, before any root prefix) of the files under ``state_dir``."""

    __slots__ = ("state_dir",)

    def __init__(self, state_dir: str = DEFAULT_STATE_DIR) -> None:
        self.state_dir = state_dir

    def _join(self, name: str) -> str:
        return self.state_dir.rstrip("/") + "/" + name

    def __repr__(self) -> str:
        return f"StatePaths({self.state_dir!r})"

    # --- the guard (the hook and the checkers read and append these) -------------------------------------------

    @property
    def compiled_policy(self) -> str:
        return self._join("policy.compiled.json")

    @property
    def overrides(self) -> str:
        return self._join("overrides.json")

    @property
    def audit_log(self) -> str:
        return self._join("audit.log")

    @property
    def guard_events(self) -> str:
        """Guard events (blocked transactions, violations, rollbacks) waiting for the daemon's report outbox."""
        return self._join("guard-events.jsonl")

    @property
    def rollback_authorization(self) -> str:
        """The one transaction a running rollback lets through the hook (agent/guard/hotpath/authorization.py)."""
        return self._join("rollback-authorization.json")

    # --- rollback ---------------------------------------------------------------------------------------------

    @property
    def known_good(self) -> str:
        return self._join("known-good.json")

    @property
    def known_good_before_change(self) -> str:
        """The known-good set as it was before the last compliant change (what a health-gated rollback restores)."""
        return self._join("known-good.before-change.json")

    @property
    def health_rollback(self) -> str:
        """What the last health-gated rollback removed and restored."""
        return self._join("health-rollback.json")

    @property
    def reboot_required(self) -> str:
        return self._join("reboot-required")

    @property
    def reboot_required_packages(self) -> str:
        """The names of the kernel module packages a rollback moved, one a line (``reboot-required.pkgs``)."""
        return self._join("reboot-required.pkgs")

    @property
    def rollback_coverage(self) -> str:
        """How many guarded packages a rollback can restore, and from what (agent.rollback_coverage)."""
        return self._join("rollback-coverage.json")

    @property
    def debs(self) -> str:
        return self._join("debs")

    @property
    def rpms(self) -> str:
        return self._join("rpms")

    @property
    def dnf_script(self) -> str:
        """The ``dnf shell`` script an rpm rollback runs."""
        return self._join("rollback.dnf")

    # --- the daemon -------------------------------------------------------------------------------------------

    @property
    def outbox(self) -> str:
        return self._join("outbox.sqlite3")

    @property
    def guard_events_position(self) -> str:
        """How far the daemon has forwarded guard-events.jsonl."""
        return self._join("guard-events.position.json")

    @property
    def guard_events_quarantine(self) -> str:
        """Guard-event lines the daemon could not turn into report events, kept as they were."""
        return self._join("guard-events.quarantine.jsonl")

    @property
    def last_snapshot(self) -> str:
        return self._join("last-snapshot.json")

    @property
    def health_deferral(self) -> str:
        """The full health check the daemon waits to run until the GPUs are idle."""
        return self._join("health-deferral.json")

    @property
    def health_gate(self) -> str:
        """The last guarded set that passed a health check and the package changes since (the health gate's window)."""
        return self._join("health-gate.json")

    @property
    def maintenance(self) -> str:
        """The node this host holds from its scheduler while it changes (agent/integrations/maintenance.py)."""
        return self._join("maintenance.json")

    JOB_RESULT_PREFIX = ".job-"
    JOB_RESULT_SUFFIX = ".result.json"

    def job_result(self, job: str, run: str) -> str:
        """Where one child of the daemon job ``job`` writes its result. ``run`` (the daemon's pid and a count) keeps
        two children of one name apart: the heartbeat's and delivery's lean children can overlap, and with one file
        each took or removed the other's result (issue #45)."""
        return self._join(f"{self.JOB_RESULT_PREFIX}{job}.{run}{self.JOB_RESULT_SUFFIX}")

    # --- health, metrics, caches ------------------------------------------------------------------------------

    @property
    def health_last_result(self) -> str:
        return self._join("health/last.json")

    @property
    def health_baselines(self) -> str:
        return self._join("health/baselines.json")

    @property
    def health_workload_baselines(self) -> str:
        """Per-workload baselines keyed by stack (agent/health/workload_baseline.py)."""
        return self._join("health/workload-baselines.json")

    @property
    def health_check_lock(self) -> str:
        """Held (flock) by whoever runs a health check; names the holder and its probe (agent/health/checklock.py)."""
        return self._join("health/check.lock")

    @property
    def metrics_textfile(self) -> str:
        """The node_exporter textfile when ``[report] metrics_textfile`` names none."""
        return self._join("metrics/gpuguard.prom")

    # --- the signed policy bundle (agent/bundle/) ----------------------------------------------------------------

    @property
    def policy_bundle_dir(self) -> str:
        return self._join("policy-bundle")

    @property
    def policy_bundle(self) -> str:
        """The bundle in force, as its signature covers it."""
        return self._join("policy-bundle/bundle.json")

    @property
    def policy_bundle_signature(self) -> str:
        return self._join("policy-bundle/bundle.json.sig")

    @property
    def policy_bundle_policy_dir(self) -> str:
        """The bundle's policy files, extracted: what ``policy_source = "bundle"`` compiles."""
        return self._join("policy-bundle/policy.d")

    @property
    def policy_bundle_matrix(self) -> str:
        """The AMD matrix the bundle carries (absent when it carries none)."""
        return self._join("policy-bundle/amd-compat-matrix.toml")

    @property
    def policy_bundle_knowledge_dir(self) -> str:
        """The knowledge tables the bundle carries, one ``<table>.toml`` each (absent when it carries none)."""
        return self._join("policy-bundle/knowledge")

    @property
    def policy_bundle_state(self) -> str:
        """Serial in force, signing key, source, install time, last refusal (agent/bundle/state.py)."""
        return self._join("policy-bundle/state.json")

    @property
    def policy_root(self) -> str:
        """The root trusted now (agent/bundle/root.py), as its signatures cover it; ``.sig`` beside it."""
        return self._join("policy-bundle/root.json")

    @property
    def policy_deny(self) -> str:
        """The known-bad versions in force (agent/bundle/deny.py), as their signatures cover them; ``.sig`` beside
        it."""
        return self._join("policy-bundle/deny.json")

    @property
    def workloads_verified(self) -> str:
        """The hub's verified stacks per registered workload, cached (agent/hostfacts/verified_stacks.py)."""
        return self._join("workloads-verified.json")

    @property
    def tls_anchors(self) -> str:
        """Hashed copies of the CA files the lean child verifies with (agent/report/tls_anchors.py)."""
        return self._join("tls-anchors")

    def fact_cache(self, name: str) -> str:
        """One collector fact cache (agent/collectors/factcache.py)."""
        return self._join(f"cache/{name}.json")
