"""The hub's ``GET /metrics`` in the Prometheus text format (prometheus-client).

Fleet figures are read from the database at each scrape (grouped queries over ``hosts`` and a one-hour window of
``events``), so every hub process over one database answers the same:

    gpuguard_hub_hosts{compliance}                  hosts by compliance (compliant, violating, unknown)
    gpuguard_hub_hosts_by_health{status}            hosts by last reported health status ("none": not yet)
    gpuguard_hub_hosts_stale                        hosts silent for longer than stale_after_seconds
    gpuguard_hub_hosts_clock_skewed                 hosts whose newest heartbeat's time is further than
                                                    agent/wire.py's CLOCK_SKEW_BOUND_SECONDS from its receipt
    gpuguard_hub_hosts_by_pairing{os,...}           hosts per driver/ROCm/CUDA/kernel pairing
    gpuguard_hub_hosts_by_rollback_coverage{coverage}  hosts by their newest heartbeat's rollback coverage:
                                                    complete, incomplete, inexact, unknown
    gpuguard_hub_guarded_packages_not_restorable    guarded packages no kept file can restore, all hosts together
    gpuguard_hub_events_last_hour{kind,severity}    events (not heartbeats) the hub received in the last hour
    gpuguard_hub_alert_deliveries{webhook,state}    alert webhook deliveries: pending, delivered, dead
    gpuguard_hub_policy_newest_serial               the newest policy bundle not withdrawn (0: none)
    gpuguard_hub_host_policy_serial{host_id}        per host, the serial of the bundle it enforces (hosts with one)
    gpuguard_hub_hosts_policy_behind                hosts offered a newer bundle (in their scope) than they enforce
    gpuguard_hub_hosts_policy_refused               hosts whose last refused bundle is newer than the one they enforce
    gpuguard_hub_hosts_policy_refused_by_kind{kind}  the same hosts by refusal kind (agent/wire.py's REFUSAL_KINDS)
    gpuguard_hub_hosts_policy_ahead                 hosts enforcing a serial above every bundle offered (fast-forward)
    gpuguard_hub_hosts_policy_attention{word}       hosts whose newest heartbeat reports the word (agent/wire.py's
                                                    POLICY_ATTENTION: "expired", "freshness", "denied"), 0 incl.
    gpuguard_hub_hosts_unknown_versions{table}      hosts whose newest heartbeat reports a version newer than the
                                                    table knows (agent/wire.py's UNKNOWN_TABLES: "amd-matrix",
                                                    "therock", "dcgm-exporter"), 0 included
    gpuguard_hub_rollout_state{rollout_id,state}    the active (else newest) staged rollout: 1 for its state, 0 others
    gpuguard_hub_rollout_stage{rollout_id}          its open stage (-1: none yet, 0: canaries)
    gpuguard_hub_rollout_hosts{rollout_id,stage}    its hosts per stage ("waiting": not admitted)
    gpuguard_hub_rollout_hosts_by_result{rollout_id,result}  admitted hosts by evidence: pass, fail, wait
    gpuguard_hub_workload_stack_hosts{workload,stack_id,driver,gpu_stack,result}  per registered workload and
                                                    stack, hosts where a check passed (result "pass") or failed ("fail")
    gpuguard_hub_workload_stack_checks{workload,stack_id,driver,gpu_stack,result}  the same in checks
    gpuguard_hub_store_up                           1 when the database answered this scrape

and one figure of this process:

    gpuguard_hub_ingest_seconds{code}               POST /v1/events, from the request's start to the answer
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric

from agent.errors import StoreError
from agent.hub.alerts import AlertQueue
from agent.hub.bundles import PolicyRollout
from agent.hub.dashboard import queries
from agent.hub.middleware import WatchedSend
from agent.hub.rollout_plan import ROLLOUT_STATES, RolloutStatus
from agent.hub.store import SqlStore
from agent.hub.workload_stacks import StackCell, matrix
from agent.log import get_logger
from agent.report.events import PAYLOAD_KINDS
from agent.wire import CLOCK_SKEW_BOUND_SECONDS

log = get_logger("hub.metrics")

EVENT_WINDOW = dt.timedelta(hours=1)
# Heartbeats are left out of the event counts: they are most of the rows (one per host per interval), and
# gpuguard_hub_hosts_stale already says who stopped sending them.
COUNTED_KINDS = tuple(k for k in PAYLOAD_KINDS if k != "heartbeat")
INGEST_BUCKETS_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_PAIRING_LABELS = {"os": "os_id", "os_version": "os_version_id", "kernel": "kernel_running",
                   "amdgpu": "amdgpu_loaded", "rocm": "rocm", "nvidia": "nvidia_loaded", "cuda": "cuda_driver_api"}


class FleetCollector:
    """Reads the fleet's state from the store at each scrape."""

    def __init__(self, store: SqlStore, alerts: AlertQueue, stale_after_seconds: float,
                 clock: Callable[[], dt.datetime],
                 policy_rollout: Optional[Callable[[], PolicyRollout]] = None,
                 staged_rollout: Optional[Callable[[], Optional[RolloutStatus]]] = None) -> None:
        self._store = store
        self._staged_rollout = staged_rollout
        self._alerts = alerts
        self._policy_rollout = policy_rollout
        self._stale_after_seconds = stale_after_seconds
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("gpuguard_hub_store_up", "1 when the database answered this scrape, else 0.")
        try:
            families = self._families()
        except StoreError as exc:
            log.error("hub_metrics_store_failed", error=str(exc))
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _families(self) -> List[Metric]:
        now = self._clock()
        counts = queries.fleet_counts(self._store, now - dt.timedelta(seconds=self._stale_after_seconds))
        groups, without = queries.pairing_groups(self._store)
        rollback = queries.rollback_counts(self._store)
        events = queries.event_counts(self._store, now - EVENT_WINDOW, COUNTED_KINDS)
        deliveries = self._alerts.counts()
        unknown_counts = queries.unknown_version_counts(self._store)

        hosts = GaugeMetricFamily("gpuguard_hub_hosts", "Hosts by compliance with their pinned pairing (newest "
                                                        "heartbeat).", labels=["compliance"])
        for state, count in counts.compliance.items():
            hosts.add_metric([state], count)
        health = GaugeMetricFamily("gpuguard_hub_hosts_by_health", "Hosts by their last reported health check "
                                                                   "status.", labels=["status"])
        for status, count in counts.health.items():
            health.add_metric([status], count)
        stale = GaugeMetricFamily("gpuguard_hub_hosts_stale", f"Hosts not heard from for more than "
                                                              f"{self._stale_after_seconds:g} seconds.")
        stale.add_metric([], counts.stale)
        skewed = GaugeMetricFamily("gpuguard_hub_hosts_clock_skewed", f"Hosts whose clock is more than "
                                                                      f"{CLOCK_SKEW_BOUND_SECONDS} seconds off the "
                                                                      "hub's (newest heartbeat's time against its "
                                                                      "receipt).")
        skewed.add_metric([], counts.clock_skewed)
        pairing = GaugeMetricFamily("gpuguard_hub_hosts_by_pairing", "Hosts per OS/kernel/driver/ROCm/CUDA pairing "
                                                                     "(empty label: not present).",
                                    labels=list(_PAIRING_LABELS))
        for g in groups:
            pairing.add_metric([getattr(g, f) or "" for f in _PAIRING_LABELS.values()], g.host_count)
        no_pairing = GaugeMetricFamily("gpuguard_hub_hosts_without_pairing", "Hosts that reported no pairing yet.")
        no_pairing.add_metric([], without)
        recent = GaugeMetricFamily("gpuguard_hub_events_last_hour",
                                   "Events other than heartbeats the hub received in the last hour, by kind and "
                                   "severity.",
                                   labels=["kind", "severity"])
        for row in events:
            recent.add_metric([row.kind, row.severity], row.event_count)
        alerts = GaugeMetricFamily("gpuguard_hub_alert_deliveries", "Alert webhook deliveries by state (dead: gave "
                                                                    "up after alert_max_attempts).",
                                   labels=["webhook", "state"])
        by_webhook: Dict[str, Dict[str, int]] = {name: {} for name in self._alerts.webhooks}
        for (webhook, state), count in deliveries.items():
            by_webhook.setdefault(webhook, {})[state] = count
        for webhook, states in sorted(by_webhook.items()):
            for state in ("pending", "delivered", "dead"):
                alerts.add_metric([webhook, state], states.get(state, 0))
        coverage = GaugeMetricFamily("gpuguard_hub_hosts_by_rollback_coverage", "Hosts by the rollback coverage of "
                                     "their newest heartbeat: complete (every guarded package restorable exactly), "
                                     "incomplete, inexact, unknown.", labels=["coverage"])
        for state, count in rollback.hosts.items():
            coverage.add_metric([state], count)
        unrestorable = GaugeMetricFamily("gpuguard_hub_guarded_packages_not_restorable",
                                         "Guarded packages no kept package file can restore, all hosts together.")
        unrestorable.add_metric([], rollback.not_restorable)
        unknown = GaugeMetricFamily("gpuguard_hub_hosts_unknown_versions", "Hosts whose newest heartbeat reports a "
                                    "version newer than gpuguard's table knows (reported, not judged).",
                                    labels=["table"])
        for table, count in unknown_counts.items():
            unknown.add_metric([table], count)
        return [hosts, health, stale, skewed, pairing, no_pairing, coverage, unrestorable, unknown, recent, alerts,
                *self._policy_families(), *self._rollout_families(), *workload_families(matrix(self._store))]

    def _rollout_families(self) -> List[Metric]:
        status = self._staged_rollout() if self._staged_rollout is not None else None
        if status is None:
            return []
        rid = status.rollout.rollout_id
        state = GaugeMetricFamily("gpuguard_hub_rollout_state", "The active (else newest) staged rollout: 1 for "
                                                                "its state.", labels=["rollout_id", "state"])
        for name in ROLLOUT_STATES:
            state.add_metric([rid, name], 1 if status.rollout.state == name else 0)
        stage = GaugeMetricFamily("gpuguard_hub_rollout_stage", "The rollout's open stage (-1: none, 0: canaries).",
                                  labels=["rollout_id"])
        stage.add_metric([rid], status.rollout.stage)
        per_stage = GaugeMetricFamily("gpuguard_hub_rollout_hosts", "The rollout's hosts per stage (waiting: not "
                                                                    "admitted).", labels=["rollout_id", "stage"])
        for name, count in sorted(status.hosts_by_stage.items()):
            per_stage.add_metric([rid, name], count)
        results = GaugeMetricFamily("gpuguard_hub_rollout_hosts_by_result", "The rollout's admitted hosts by evidence.",
                                    labels=["rollout_id", "result"])
        for result in ("pass", "fail", "wait"):
            results.add_metric([rid, result], sum(h.stage is not None and h.evidence is not None
                                                  and h.evidence.result == result for h in status.hosts))
        return [state, stage, per_stage, results]

    def _policy_families(self) -> List[Metric]:
        if self._policy_rollout is None:
            return []
        rollout = self._policy_rollout()
        newest = GaugeMetricFamily("gpuguard_hub_policy_newest_serial", "The newest policy bundle not withdrawn "
                                                                         "(0: none).")
        newest.add_metric([], rollout.newest_serial or 0)
        per_host = GaugeMetricFamily("gpuguard_hub_host_policy_serial", "The serial of the policy bundle each host "
                                                                        "enforces (newest heartbeat).",
                                     labels=["host_id"])
        for row in rollout.hosts:
            if row.policy_serial is not None:
                per_host.add_metric([row.host_id], row.policy_serial)
        behind = GaugeMetricFamily("gpuguard_hub_hosts_policy_behind", "Hosts offered a newer bundle in their scope "
                                                                       "than the one they enforce.")
        behind.add_metric([], rollout.behind_count)
        refused = GaugeMetricFamily("gpuguard_hub_hosts_policy_refused", "Hosts whose last refused bundle is newer "
                                                                         "than the one they enforce.")
        refused.add_metric([], rollout.refused_count)
        by_kind = GaugeMetricFamily("gpuguard_hub_hosts_policy_refused_by_kind", "Hosts whose last refusal is newer "
                                                                                 "than what they enforce, by kind.",
                                    labels=["kind"])
        for kind, count in sorted(rollout.refused_by_kind.items()):
            by_kind.add_metric([kind], count)
        ahead = GaugeMetricFamily("gpuguard_hub_hosts_policy_ahead", "Hosts enforcing a serial above every bundle "
                                                                     "the hub offers (a fast-forward).")
        ahead.add_metric([], rollout.ahead_count)
        attention = GaugeMetricFamily("gpuguard_hub_hosts_policy_attention", "Hosts whose newest heartbeat reports "
                                                                             "the policy attention word (the policy "
                                                                             "keeps guarding).", labels=["word"])
        for word, count in sorted(rollout.attention_by_word.items()):
            attention.add_metric([word], count)
        return [newest, per_host, behind, refused, by_kind, ahead, attention]


def workload_families(cells: List[StackCell]) -> List[Metric]:
    """The verified-stack matrix: hosts and checks per workload, stack and result (pass, fail)."""
    labels = ["workload", "stack_id", "driver", "gpu_stack", "result"]
    hosts = GaugeMetricFamily("gpuguard_hub_workload_stack_hosts", "Per registered workload and stack, the hosts "
                                                                   "where a check passed or failed.", labels=labels)
    checks = GaugeMetricFamily("gpuguard_hub_workload_stack_checks", "Per registered workload and stack, the checks "
                                                                     "that passed or failed (each counted once).",
                               labels=labels)
    for c in cells:
        stack = [c.workload, c.stack_id, c.stack.driver or "", c.stack.gpu_stack or ""]
        hosts.add_metric([*stack, "pass"], c.hosts_passed)
        hosts.add_metric([*stack, "fail"], c.hosts_failed)
        checks.add_metric([*stack, "pass"], c.passes)
        checks.add_metric([*stack, "fail"], c.failures)
    return [hosts, checks]


class HubMetrics:
    """This app's registry: the fleet collector and the ingest latency histogram."""

    def __init__(self, store: SqlStore, alerts: AlertQueue, stale_after_seconds: float,
                 clock: Callable[[], dt.datetime],
                 policy_rollout: Optional[Callable[[], PolicyRollout]] = None,
                 staged_rollout: Optional[Callable[[], Optional[RolloutStatus]]] = None) -> None:
        disable_created_metrics()  # no *_created series: a restart is visible from process metrics anyway
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(FleetCollector(store, alerts, stale_after_seconds, clock, policy_rollout,
                                                             staged_rollout))
        self.ingest_seconds = Histogram("gpuguard_hub_ingest_seconds", "POST /v1/events: from the request's start "
                                        "to the answer, by status code class (this process).", ["code"],
                                        buckets=INGEST_BUCKETS_SECONDS, registry=self.registry)

    def timed(self, asgi: Callable[..., Any]) -> Callable[..., Any]:
        """``asgi`` (the ingest handler), observed into the latency histogram."""
        histogram = self.ingest_seconds

        async def observed(scope: Dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
            started = time.perf_counter()
            watched = WatchedSend(send)
            try:
                await asgi(scope, receive, watched)
            finally:
                code = f"{watched.status // 100}xx" if watched.status is not None else "none"
                histogram.labels(code).observe(time.perf_counter() - started)

        return observed
