"""A key rotation through the channel across a fleet of 20 host roots and a real hub on 127.0.0.1: with one fetch
each (the daemon's fetch job, in process), every host walks to root 2, takes the new key's bundle and refuses the
old key afterwards; the bundle in force past its expiry is attention on every host."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import List

import pytest

from agent.bundle.state import read_bundle_state
from agent.config import parse_settings
from agent.daemon_jobs.policy_fetch import fetch_and_install
from agent.host import Host
from agent.hub.tokens import add_token
from tests.bundle.keys import Signer
from tests.bundle.roots import role, sign_by, write_root
from tests.bundle.test_install import PERMISSIVE, POLICY, Site, run
from tests.hub.process import HubProcess, write_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # a hub and 20 host roots, gpgv thrice per fetch

HOSTS = int(os.environ.get("GPUGUARD_TEST_FLEET_AGENTS", "20"))


def test_a_rotation_reaches_every_host_in_one_fetch_and_the_old_key_is_refused_after(tmp_path: Path) -> None:
    """Root 1 (fleet key p1) on every host; the hub serves root 2 (fleet key p2, signed by both root keys) and a
    bundle by p2: one fetch per host installs it under root 2; a bundle by p1 is then refused by the hub and
    (signature) on every host it is carried to; past the bundle's expiry every host reports it as attention."""
    r1, r2, p1, p2, f1 = (Signer(tmp_path, name) for name in ("r1", "r2", "p1", "p2", "f1"))
    everyone = [r1, r2, p1, p2, f1]
    roots = tmp_path / "roots"
    one = write_root(roots / "1.root.json", 1, [r1, r2], 2, [role("fleet", [p1], 1)], [f1], everyone)
    sign_by(one, [r1, r2])
    hub_roots = tmp_path / "hub-roots"
    hub_roots.mkdir()
    for suffix in ("", ".sig"):  # the hub holds every root from the first: it checks pushes against the newest
        (hub_roots / f"1.root.json{suffix}").write_bytes(Path(f"{one}{suffix}").read_bytes())
    tokens = tmp_path / "tokens.json"
    hub = HubProcess(write_config(tmp_path / "hub.toml", listen_host="127.0.0.1", listen_port=0,
                                  database_url=f"sqlite:///{tmp_path}/hub.db", tokens_file=tokens,
                                  tokens_reload_seconds=0, shutdown_timeout_seconds=5, root_dir=hub_roots,
                                  freshness_gnupg_home=f1.home, freshness_key=f1.fingerprint)).start()
    try:
        admin = tmp_path / "admin.token"
        admin.write_text(add_token(str(tokens), "admin", "alice") + "\n")
        os.chmod(admin, 0o600)
        sites: List[Site] = []
        for index in range(HOSTS):
            site = Site(tmp_path / f"host-{index}")
            keys = site.root / "etc/gpuguard/keys"
            (keys / "root.json").write_bytes(one.read_bytes())
            (keys / "root.json.sig").write_bytes(Path(f"{one}.sig").read_bytes())
            token = site.tmp / "host.token"
            token.write_text(add_token(str(tokens), "host", f"node-{index}") + "\n")
            os.chmod(token, 0o600)
            site.config.write_text(site.config.read_text() + f'[report]\nendpoint_url = "{hub.url}"\n'
                                                              f'token_file = "{token}"\n')
            sites.append(site)
        maker = sites[0]

        def bundle(serial: int, signer: Signer, policy: str) -> Path:
            made = maker.bundle(serial, policy, "--all", "--expires-days", "30", sign=False,
                                name=f"fleet-{serial}.json")
            sign_by(made, [signer])
            code, out, err = run("hub", "policy", "push", str(made), "--hub", hub.url, "--token-file", str(admin))
            assert code == 0, out + err
            return made

        def fetch_all() -> List[str]:
            return [fetch_and_install(Host.for_root(str(site.root)), parse_settings(site.config.read_text()),
                                      f"node-{index}").outcome for index, site in enumerate(sites)]

        bundle(1, p1, PERMISSIVE)
        assert fetch_all() == ["installed"] * HOSTS
        two = write_root(hub_roots / "2.root.json", 2, [r1, r2], 2, [role("fleet", [p2], 1)], [f1], everyone)
        sign_by(two, [r1, r2])
        bundle(2, p2, POLICY)
        assert fetch_all() == ["installed"] * HOSTS  # one fetch each: root 2 walked, p2's bundle taken
        for site in sites:
            state = read_bundle_state(str(site.state / "policy-bundle/state.json"))
            assert (state.serial, state.signers, state.refused) == (2, (p2.fingerprint,), None)
            assert b'"version": 2' in (site.state / "policy-bundle/root.json").read_bytes()
            assert site.hook_refuses()
        old_key = maker.bundle(3, PERMISSIVE, "--all", "--expires-days", "30", sign=False, name="fleet-3.json")
        sign_by(old_key, [p1])
        code, out, err = run("hub", "policy", "push", str(old_key), "--hub", hub.url, "--token-file", str(admin))
        assert code != 0 and "signature" in out + err  # the hub checks pushes against its newest root
        assert fetch_all() == ["unchanged"] * HOSTS
        for site in sites:  # the same bundle carried by hand (the air-gapped path) is refused on every host
            assert site.install(old_key)[0] == 17
        later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=31)
        for site in sites:
            state = read_bundle_state(str(site.state / "policy-bundle/state.json"))
            assert state.serial == 2 and state.refused is not None and state.refused.kind == "signature"
            assert "expired" in state.attention(later) and site.hook_refuses()
    finally:
        hub.stop()
        f1.close()
