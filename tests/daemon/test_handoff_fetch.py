"""A newly installed policy bundle begins the maintenance hand-off: the daemon's policy fetch in a real job child,
against a real hub on 127.0.0.1, marks the node for Kubernetes; an unchanged bundle (304) begins nothing more."""

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


def test_an_installed_bundle_labels_the_node_for_maintenance(hub: HubProcess, tmp_path: Path) -> None:  # noqa: F811
    """The fetch child installs serial 3 and writes gpuguard.io/maintenance=policy_bundle_serial_3 with the hold
    in maintenance.json; the next fetch (304) leaves both as they are."""
    site, _host_token, admin = hub_site(hub, tmp_path)
    site.config.write_text(site.config.read_text() + f'nfd_features_file = "/{FEATURES}/gpuguard"\n'
                                                     '[integrations]\nscheduler = "kubernetes"\n')
    (site.root / FEATURES).mkdir(parents=True)
    bundle = site.bundle(3, POLICY, "--host-id", "node-1")
    assert run("hub", "policy", "push", str(bundle), "--hub", hub.url, "--token-file", str(admin))[0] == 0
    rt = make_runtime(tmp_path, Host.for_root(str(site.root)), load_settings(str(site.config)))
    asked: List[str] = []
    PolicyFetchInChild(rt, str(site.config), asked.append).run()
    label = site.root / FEATURES / "gpuguard-maintenance"
    assert asked == ["policy_bundle_installed"]
    assert label.read_text().startswith("gpuguard.io/maintenance=true\n"
                                        "gpuguard.io/maintenance-reason=policy_bundle_serial_3\n")
    hold = (site.state / "maintenance.json").read_text()
    PolicyFetchInChild(rt, str(site.config), asked.append).run()
    assert asked == ["policy_bundle_installed"] and (site.state / "maintenance.json").read_text() == hold
