"""A policy bundle pushed outside a staged rollout does not begin the maintenance hand-off: the daemon's policy
fetch in a real job child, against a real hub on 127.0.0.1, installs it and leaves the node to the scheduler (a
rollout's admission does begin it: tests/bundle/test_rollout.py), and ends a rollout's hold when the host's packages
already comply with it (the rollout aborted before the host changed)."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

from agent.config import load_settings
from agent.daemon_jobs.children import PolicyFetchInChild
from agent.host import Host
from tests.bundle.test_fetch import hub_site
from tests.bundle.test_install import POLICY, run
from tests.daemon.test_jobs import make_runtime
from tests.hub.process import HubProcess
from tests.hub.test_cli_hub_policy import hub  # noqa: F401 - the real hub fixture

pytestmark = pytest.mark.slow  # a real hub process

FEATURES = "etc/kubernetes/node-feature-discovery/features.d"


def test_a_bundle_installed_outside_a_rollout_leaves_the_node_in_service(hub: HubProcess,  # noqa: F811
                                                                         tmp_path: Path) -> None:
    """The fetch child installs serial 3, pushed to its whole scope at once: no maintenance label and no hold (that
    would drain every node in the scope together, each until a package change that may never come); the next fetch
    (304) changes nothing either."""
    site, _host_token, admin = hub_site(hub, tmp_path)
    site.config.write_text(site.config.read_text() + f'nfd_features_file = "/{FEATURES}/gpuguard"\n'
                                                     '[integrations]\nscheduler = "kubernetes"\n')
    (site.root / FEATURES).mkdir(parents=True)
    bundle = site.bundle(3, POLICY, "--host-id", "node-1")
    assert run("hub", "policy", "push", str(bundle), "--hub", hub.url, "--token-file", str(admin))[0] == 0
    rt = make_runtime(tmp_path, Host.for_root(str(site.root)), load_settings(str(site.config)))
    asked: List[str] = []
    for _ in range(2):
        PolicyFetchInChild(rt, str(site.config), asked.append).run()
        assert asked == ["policy_bundle_installed"]
        assert not (site.root / FEATURES / "gpuguard-maintenance").exists()
        assert not (site.state / "maintenance.json").exists()


def test_a_bundle_installed_after_an_aborted_rollout_ends_its_hold(hub: HubProcess,  # noqa: F811
                                                                  tmp_path: Path) -> None:
    """The host holds its node for rollout R (the maintenance label set), R is aborted before the host changed,
    and the fetch child installs serial 3 outside any admission: the host's packages comply with it, so the hold
    and its label are gone (they used to stay until an operator ended them)."""
    from agent.daemon_jobs.handoff import begin_for_change
    from agent.integrations.hold import read_state
    from agent.statepaths import StatePaths

    site, _host_token, admin = hub_site(hub, tmp_path)
    site.config.write_text(site.config.read_text() + f'nfd_features_file = "/{FEATURES}/gpuguard"\n'
                                                     '[integrations]\nscheduler = "kubernetes"\n')
    (site.root / FEATURES).mkdir(parents=True)
    host, settings = Host.for_root(str(site.root)), load_settings(str(site.config))
    assert begin_for_change(host, settings, "rollout r2-ab12cd stage 1", rollout_id="r2-ab12cd") is not None
    label = site.root / FEATURES / "gpuguard-maintenance"
    assert "gpuguard.io/maintenance-rollout=r2-ab12cd" in label.read_text()
    bundle = site.bundle(3, POLICY, "--host-id", "node-1")
    assert run("hub", "policy", "push", str(bundle), "--hub", hub.url, "--token-file", str(admin))[0] == 0
    asked: List[str] = []
    PolicyFetchInChild(make_runtime(tmp_path, host, settings), str(site.config), asked.append).run()
    assert asked == ["policy_bundle_installed"]
    assert not label.exists() and read_state(host, StatePaths("/var/lib/gpuguard")) is None
