"""The daemon's policy fetch: on the heartbeat's schedule, ask the hub for the newest bundle in this host's scope
and install it as ``gpuguard policy install`` does (agent/bundle/install.py).

A 304 (the serial in force) costs nothing, and so does an offer below the serial in force (the hub offers an older
bundle once the newer is withdrawn: an agent never goes back by itself); a refused bundle is recorded in
``policy-bundle/state.json`` and reported by the next heartbeat; a hub that cannot be reached changes nothing (the
policy in force keeps guarding). The hub's staged-rollout fields and notice of every answer are kept in the same
state (none clears them; a failed fetch keeps the ones before): the fields decide the maintenance hand-off, the
hook's refusal, ``gpuguard status`` and ``policy explain`` show the notice. When the policy in force has a
``[workloads]`` section, the hub's verified stacks are fetched too (agent/bundle/verified.py) for the hook's rule.
Runs in a job child (``gpuguard _job policy_fetch``): requests, pydantic and gpgv stay out of the resident. A
successful fetch hands back the plan of a stdlib-only probe (agent/daemon_jobs/hub_probe.py) that the daemon runs
first next time: only answers that differ from the last ones start this child again (issue #45).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, List, Optional, Tuple

from agent.daemon_jobs.protocol import HubProbePlan, PolicyFetchResult

if TYPE_CHECKING:  # pragma: no cover
    from agent.bundle.install import BundleInstaller
    from agent.config import Settings
    from agent.host import Host


def fetch_and_install(host: "Host", settings: "Settings", host_id: str) -> PolicyFetchResult:
    """One fetch and, for a new offer, one install, with the next probe's plan; never raises for what the hub, the
    network or the bundle does."""
    result = _fetch_and_install(host, settings, host_id)
    if result.outcome == "off":
        return result
    # The plan depends on this host's files only: a failed fetch hands it back too, so that while the hub is down
    # the daemon runs the probe, not this child (it records no digest for a failed fetch: the next answer counts).
    return dataclasses.replace(result, probe=probe_plan(host, settings))


def probe_plan(host: "Host", settings: "Settings") -> Optional[HubProbePlan]:
    """The requests a full fetch makes now, for the stdlib-only probe (agent/daemon_jobs/hub_probe.py); None where
    the probe could not make them as requests does (a proxy from the environment) or the files cannot be read."""
    from requests.utils import DEFAULT_CA_BUNDLE_PATH, get_environ_proxies

    from agent.bundle.channel import CHANNEL_DEADLINE_SECONDS
    from agent.bundle.fetch import FETCH_DEADLINE_SECONDS, MAX_OFFER_BYTES, etag_for
    from agent.bundle.freshness import MAX_STATEMENT_BYTES
    from agent.bundle.install import BundleInstaller
    from agent.bundle.roles import MAX_ROOT_BYTES
    from agent.bundle.root import RootStore
    from agent.errors import GpuguardError
    from agent.policy.compiled import read_compiled
    from agent.report.tls_anchors import plan_anchors
    from agent.statepaths import StatePaths
    from agent.wire import BUNDLE_PATH, FRESHNESS_PATH, MAX_VERIFIED_BYTES, ROOT_PATH, VERIFIED_STACKS_PATH

    report = settings.report
    assert report.endpoint_url is not None
    base = report.endpoint_url.rstrip("/")
    if get_environ_proxies(base + BUNDLE_PATH):
        return None
    installer = BundleInstaller(host, settings.guard, settings.agent.state_dir)
    paths: List[Tuple[str, Optional[str]]] = []
    try:
        root = RootStore(installer.host, installer.paths.state_dir, installer.guard.keys_dir).trusted(base)
        if root is not None:
            paths += [(f"{ROOT_PATH}?version={root.version + 1}", None), (FRESHNESS_PATH, None)]
        try:
            compiled = read_compiled(str(host.path(StatePaths(settings.agent.state_dir).compiled_policy)))
            if compiled.section("workloads"):
                paths.append((VERIFIED_STACKS_PATH, None))
        except (GpuguardError, OSError):
            pass  # no compiled policy: refresh_verified_stacks asks nothing either
        paths.append((BUNDLE_PATH, etag_for(installer.state().serial)))
    except (GpuguardError, OSError):
        return None
    ca_file = report.ca_bundle or DEFAULT_CA_BUNDLE_PATH
    anchor_dir, stamp = plan_anchors(base, ca_file, settings.agent.state_dir)
    return HubProbePlan(endpoint_url=base, token_file=report.token_file, ca_file=ca_file,
                     ca_anchor_dir=anchor_dir, ca_file_stamp=stamp,
                     connect_timeout_seconds=report.connect_timeout_seconds,
                     read_timeout_seconds=report.read_timeout_seconds,
                     deadline_seconds=FETCH_DEADLINE_SECONDS + CHANNEL_DEADLINE_SECONDS,
                     max_bytes=max(MAX_OFFER_BYTES, 2 * MAX_ROOT_BYTES, 2 * MAX_STATEMENT_BYTES, MAX_VERIFIED_BYTES),
                     paths=tuple(paths))


def _fetch_and_install(host: "Host", settings: "Settings", host_id: str) -> PolicyFetchResult:
    from agent.bundle.channel import refresh_trust
    from agent.bundle.facts import host_scope_facts
    from agent.bundle.fetch import fetch_offer
    from agent.bundle.install import BundleInstaller
    from agent.bundle.scope import ScopeFacts
    from agent.errors import BundleRefused, GpuguardError
    from agent.report.credentials import read_credentials
    from agent.statepaths import StatePaths

    report = settings.report
    if report.endpoint_url is None:
        return PolicyFetchResult(outcome="off")
    installer = BundleInstaller(host, settings.guard, settings.agent.state_dir)
    try:
        token = read_credentials(report)
        state = installer.state()
    except GpuguardError as exc:
        return PolicyFetchResult(outcome="failed", detail=str(exc))

    def facts() -> ScopeFacts:
        return host_scope_facts(host, host_id, dict(settings.agent.labels),
                                StatePaths(settings.agent.state_dir).last_snapshot)

    timeouts = (report.connect_timeout_seconds, report.read_timeout_seconds)
    trust = refresh_trust(installer, report.endpoint_url, token, report.ca_bundle, timeouts, facts) or ""
    flag_denied_installed(host, installer)
    refresh_verified_stacks(host, settings, token)
    offer = fetch_offer(report.endpoint_url, token, report.ca_bundle, state.serial, timeouts)
    if offer.status != "failed":
        try:
            installer.record_rollout(offer.notice, offer.rollout)
        except (GpuguardError, OSError) as exc:
            return PolicyFetchResult(trust=trust, outcome="failed", detail=f"rollout notice: {exc}")
    if offer.status in ("unchanged", "none", "offered"):
        # A 304 offers the serial in force; 204 offers nothing (below a bundle the hub gave); 200 offers its serial.
        offered = {"unchanged": state.serial, "none": None if state.source == "hub" else state.serial}.get(
            offer.status, offer.serial)
        try:
            installer.record_hub_offer(offered)
        except (GpuguardError, OSError) as exc:
            return PolicyFetchResult(trust=trust, outcome="failed", detail=f"hub offer: {exc}")
    if offer.status != "offered":
        outcome = {"unchanged": "unchanged", "none": "none"}.get(offer.status, "failed")
        return PolicyFetchResult(trust=trust, outcome=outcome, serial=offer.serial, detail=offer.detail,  # type: ignore[arg-type]
                                 rollout=offer.notice, rollout_fields=offer.rollout)

    if (state.serial is not None and offer.serial is not None and offer.serial < state.serial
            and not installer.floor_void()):
        # An older bundle than the one in force (the newer one withdrawn, a rollout aborted): never installed, so
        # not checked, recorded or reported as a refusal at every interval on every host that took the newer one.
        return PolicyFetchResult(trust=trust, outcome="unchanged", serial=state.serial, rollout=offer.notice,
                                 rollout_fields=offer.rollout,
                                 detail=f"the hub offers serial {offer.serial}, below serial {state.serial} in force")

    try:
        installed = installer.install(offer.bundle, offer.signature, origin=f"hub bundle serial {offer.serial}",
                                      source="hub", facts=facts)
    except BundleRefused as exc:
        # exc.serial: the bundle's own once its signature was verified; the hub's claim is never kept.
        return PolicyFetchResult(trust=trust, outcome="refused", serial=exc.serial, kind=exc.kind, detail=exc.reason,
                                 rollout=offer.notice, rollout_fields=offer.rollout)
    except (GpuguardError, OSError) as exc:
        return PolicyFetchResult(trust=trust, outcome="failed", detail=f"install: {exc}")
    if installed.unchanged:
        return PolicyFetchResult(trust=trust, outcome="unchanged", serial=installed.serial, rollout=offer.notice,
                                 rollout_fields=offer.rollout)
    return PolicyFetchResult(trust=trust, outcome="installed", serial=installed.serial, rollout=offer.notice,
                             rollout_fields=offer.rollout,
                             detail="compiled" if installed.compiled else "kept: [guard] policy_source is local")


def flag_denied_installed(host: "Host", installer: "BundleInstaller") -> Tuple[str, ...]:
    """Record and return the packages installed here at a version the deny list in force denies (``name version:
    rule``; ``status`` attention, the heartbeat's ``denied`` word, the hub's count and alert): after a fetch, a
    ``policy deny install`` and every guard check (a package change, agent/daemon_jobs/guard.py). Logged, never
    raised: () when the check could not be made (what was recorded stays)."""
    from agent.bundle.deny import compiled_entries, deny_in_force
    from agent.errors import GpuguardError
    from agent.guard.installed import detect_manager, read_installed
    from agent.log import get_logger
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.evaluate import HostState, evaluate

    log = get_logger("daemon.policy_fetch")
    try:
        deny = deny_in_force(host, installer.paths)
        found: List[str] = []
        if deny is not None and deny.entries:
            patterns = [pattern for entry in deny.entries for pattern in entry.packages]
            installed = {key: package.version for key, package in read_installed(host, patterns).items()}
            policy = CompiledPolicy({"denied": compiled_entries(deny)}, "deny list")
            for violation in evaluate(HostState.standing(installed, detect_manager(host)), policy):
                found += [f"{key} {version}: {violation.rule}" for key, version in violation.packages.items()]
        installer.record_denied_installed(sorted(found))
    except (GpuguardError, OSError) as exc:
        log.warning("known_bad_check_failed", error=str(exc))
        return ()
    if found:
        log.warning("known_bad_installed", packages=found)
    return tuple(sorted(found))


def refresh_verified_stacks(host: "Host", settings: "Settings", token: Optional[str]) -> None:
    """The hub's verified stacks cached for the ``[workloads]`` rule, when the compiled policy has one; logged."""
    from agent.bundle.verified import refresh_verified
    from agent.errors import GpuguardError
    from agent.log import get_logger
    from agent.policy.compiled import read_compiled
    from agent.statepaths import StatePaths

    log = get_logger("daemon.policy_fetch")
    report, paths = settings.report, StatePaths(settings.agent.state_dir)
    try:
        if not read_compiled(str(host.path(paths.compiled_policy))).section("workloads"):
            return
    except (GpuguardError, OSError):
        return  # no compiled policy (or a broken one, which the guard reports): no [workloads] rule to serve
    assert report.endpoint_url is not None  # fetch_and_install returned "off" without one
    written, detail = refresh_verified(report.endpoint_url, token, report.ca_bundle,
                                       (report.connect_timeout_seconds, report.read_timeout_seconds),
                                       str(host.path(paths.workloads_verified)))
    if written:
        log.info("verified_stacks_fetched", detail=detail)
    else:
        log.warning("verified_stacks_fetch_failed", detail=detail, kept="the cached list")
