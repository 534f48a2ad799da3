"""The lean child's cheap trust load (issue #45): over real TLS on 127.0.0.1 (a generated root -> intermediate ->
leaf chain, the root inside certifi's public-sized bundle) the probe and the lean delivery verify the hub through the
CA file's hashed directory while the file is unchanged, load the whole file when its stat changed or when the
directory fails (and say so), and never verify a hub whose CA is not in the file."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
from pathlib import Path
from typing import Dict, Iterator

import pytest

from agent.daemon_jobs.children import lean_argv
from agent.daemon_jobs.hub_probe import probe
from agent.daemon_jobs.lean_delivery import Poster, Unsure
from agent.report.tls_anchors import Anchors, ensure_anchors
from agent.report.x509_subject import subject_hash
from tests.report.tls_chain import Chain, make_chain, serve_https


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Chain:
    """One generated chain for the module (openssl req four times)."""
    pytest.importorskip("certifi")
    return make_chain(tmp_path_factory.mktemp("chain"))


@pytest.fixture
def hub(chain: Chain) -> Iterator[str]:
    """The HTTPS endpoint presenting the chain's leaf and intermediate."""
    yield from serve_https(chain)


def copy_of(path: str, tmp_path: Path, name: str = "ca.pem") -> str:
    """A copy of a CA file this test may change."""
    target = tmp_path / name
    target.write_bytes(Path(path).read_bytes())
    return str(target)


def probe_plan(url: str, ca_file: str, anchors: Anchors | None) -> Dict[str, object]:
    """The probe's plan as the full fetch hands it over (JSON types)."""
    return {"endpoint_url": url, "token_file": None, "ca_file": ca_file,
            "ca_anchor_dir": None if anchors is None else anchors.directory,
            "ca_file_stamp": None if anchors is None else list(anchors.stamp),
            "connect_timeout_seconds": 10, "read_timeout_seconds": 10, "deadline_seconds": 60,
            "max_bytes": 1 << 20, "paths": [["/v1/policy/bundle", '"bundle-3"']]}


def root_file(chain: Chain, anchors: Anchors) -> Path:
    """The root's ``<hash>.0`` file in the directory."""
    der = ssl.PEM_cert_to_DER_cert(Path(chain.root).read_text(encoding="ascii"))
    return Path(anchors.directory) / f"{subject_hash(der)}.0"


def test_the_probe_verifies_through_the_directory_while_the_file_is_unchanged(hub: str, chain: Chain,
                                                                               tmp_path: Path) -> None:
    """With the plan's directory and an unchanged file the probe answers; the proof that the directory verified:
    the same plan with the root taken out of the file (its stamp matching again) still answers, and gives up
    nothing."""
    ca_file = copy_of(chain.bundle, tmp_path)
    anchors = ensure_anchors(ca_file, str(tmp_path / "anchors"))
    assert anchors is not None and root_file(chain, anchors).exists()
    answer = probe(probe_plan(hub, ca_file, anchors))
    assert answer["outcome"] == "answered" and answer["trust"] == "", answer
    # The file without the root, its stamp taken as the plan's: only the directory can hold the root now.
    Path(ca_file).write_bytes(Path(chain.public_only).read_bytes())
    info = os.stat(ca_file)
    stamped = Anchors(anchors.directory, (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns))
    answer = probe(probe_plan(hub, ca_file, stamped))
    assert answer["outcome"] == "answered" and answer["trust"] == "", answer
    assert probe(probe_plan(hub, ca_file, None))["outcome"] == "unsure"  # the file alone does not verify


def test_a_changed_ca_file_is_loaded_whole(hub: str, chain: Chain, tmp_path: Path) -> None:
    """The file's stat differs from the plan's stamp (rewritten without the root): the whole file decides, so the
    probe is unsure although the directory holds the root, and nothing was given up (the directory was not used)."""
    ca_file = copy_of(chain.bundle, tmp_path)
    anchors = ensure_anchors(ca_file, str(tmp_path / "anchors"))
    assert anchors is not None
    Path(ca_file).write_bytes(Path(chain.public_only).read_bytes())
    answer = probe(probe_plan(hub, ca_file, anchors))
    assert answer["outcome"] == "unsure" and answer["trust"] == "", answer


@pytest.mark.parametrize("damage", ["truncated", "removed", "directory_gone"])
def test_a_damaged_directory_still_verifies_through_the_whole_file_and_says_so(hub: str, chain: Chain,
                                                                                tmp_path: Path, damage: str) -> None:
    """The root's hash file truncated or removed, or the whole directory gone: the handshake through the directory
    fails verification, the probe tries once more with the whole file, answers, and its ``trust`` says why."""
    ca_file = copy_of(chain.bundle, tmp_path)
    anchors = ensure_anchors(ca_file, str(tmp_path / "anchors"))
    assert anchors is not None
    root = root_file(chain, anchors)
    if damage == "truncated":
        root.write_bytes(root.read_bytes()[:60])
    elif damage == "removed":
        root.unlink()
    else:
        for path in Path(anchors.directory).iterdir():
            path.unlink()
        Path(anchors.directory).rmdir()
    answer = probe(probe_plan(hub, ca_file, anchors))
    assert answer["outcome"] == "answered", answer
    assert anchors.directory in answer["trust"] and "whole CA file" in answer["trust"]


def test_a_hub_whose_ca_is_not_in_the_file_verifies_with_neither(hub: str, chain: Chain, tmp_path: Path) -> None:
    """The public bundle alone (built as the full child builds it): unsure through the directory and through the
    whole file after it, never ``answered`` or ``down``."""
    ca_file = copy_of(chain.public_only, tmp_path)
    anchors = ensure_anchors(ca_file, str(tmp_path / "anchors"))
    assert anchors is not None
    answer = probe(probe_plan(hub, ca_file, anchors))
    assert answer["outcome"] == "unsure" and "whole CA file" in answer["trust"], answer


def delivery_plan(url: str, ca_file: str, anchors: Anchors | None) -> Dict[str, object]:
    """A lean delivery plan's fields the Poster reads."""
    return {"ingest_url": url + "/v1/events", "ca_file": ca_file, "connect_timeout_seconds": 10,
            "read_timeout_seconds": 10, "user_agent": "gpuguard-test",
            "ca_anchor_dir": None if anchors is None else anchors.directory,
            "ca_file_stamp": None if anchors is None else list(anchors.stamp)}


def test_the_lean_delivery_posts_through_the_directory_and_falls_back_as_the_probe(hub: str, chain: Chain,
                                                                                    tmp_path: Path) -> None:
    """The lean delivery's POST verifies through the directory (nothing given up), through the whole file where the
    root's hash file is gone (said in ``trust``), and not at all for a CA file without the root."""
    ca_file = copy_of(chain.bundle, tmp_path)
    anchors = ensure_anchors(ca_file, str(tmp_path / "anchors"))
    assert anchors is not None
    poster = Poster(delivery_plan(hub, ca_file, anchors), None)
    assert poster.post(b"{}") == ([], []) and poster.trust is not None and poster.trust.fallback == ""
    damaged_file = copy_of(chain.bundle, tmp_path, "damaged.pem")  # a trust of its own (one per file in a child)
    damaged = ensure_anchors(damaged_file, str(tmp_path / "anchors-damaged"))
    assert damaged is not None
    root_file(chain, damaged).unlink()
    poster = Poster(delivery_plan(hub, damaged_file, damaged), None)
    assert poster.post(b"{}") == ([], []) and poster.trust is not None and "whole CA file" in poster.trust.fallback
    public = copy_of(chain.public_only, tmp_path, "public.pem")
    public_anchors = ensure_anchors(public, str(tmp_path / "anchors"))
    with pytest.raises(Unsure):
        Poster(delivery_plan(hub, public, public_anchors), None).post(b"{}")


def test_the_real_lean_child_uses_the_directory_and_reports_a_fallback(hub: str, chain: Chain,
                                                                       tmp_path: Path) -> None:
    """The stdlib-only lean child (``python -I -S``) answers through the directory, and after the directory is
    damaged answers with ``trust`` saying so, for the daemon to log."""
    ca_file = copy_of(chain.bundle, tmp_path)
    anchors = ensure_anchors(ca_file, str(tmp_path / "anchors"))
    assert anchors is not None

    def run_child(index: int) -> Dict[str, str]:
        result = tmp_path / f"result{index}.json"
        argv = lean_argv("lean", "", "/", json.dumps({"probe": probe_plan(hub, ca_file, anchors)}), str(result))
        subprocess.run(argv, check=True, capture_output=True, timeout=120)
        return dict(json.loads(result.read_text())["result"]["probe"])

    first = run_child(1)
    assert first["outcome"] == "answered" and first["trust"] == "", first
    root_file(chain, anchors).unlink()
    second = run_child(2)
    assert second["outcome"] == "answered" and "whole CA file" in second["trust"], second
    assert second["digest"] == first["digest"]


def test_the_full_childrens_plans_carry_the_directory_and_the_stamp_it_was_built_from(chain: Chain,
                                                                                      tmp_path: Path) -> None:
    """The policy fetch's HubProbePlan and the delivery's DeliveryPlan for an HTTPS hub name the same hashed copy of
    ``ca_bundle`` under the state directory's tls-anchors/, with the file's stamp; over plain HTTP neither does."""
    from agent.config import load_settings
    from agent.daemon_jobs.child_main import lean_delivery_plan
    from agent.daemon_jobs.policy_fetch import probe_plan as fetch_probe_plan
    from agent.host import Host
    from agent.statepaths import StatePaths
    from tests.daemon.conftest import agent_config

    ca_file = copy_of(chain.bundle, tmp_path)
    info = os.stat(ca_file)
    state = tmp_path / "state"
    for scheme in ("https", "http"):
        config = tmp_path / f"{scheme}.toml"
        config.write_text(agent_config(state, f"{scheme}://127.0.0.1:9", None, ca_bundle=ca_file))
        settings = load_settings(str(config))
        probe_side = fetch_probe_plan(Host(), settings)
        delivery_side = lean_delivery_plan(settings.report, str(state / "outbox.sqlite3"), str(state))
        assert probe_side is not None and delivery_side is not None
        for plan in (probe_side, delivery_side):
            if scheme == "http":
                assert plan.ca_anchor_dir is None and plan.ca_file_stamp is None
                continue
            assert plan.ca_file == ca_file
            assert plan.ca_anchor_dir is not None
            assert os.path.dirname(plan.ca_anchor_dir) == StatePaths(str(state)).tls_anchors
            assert plan.ca_file_stamp == (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            assert len(os.listdir(plan.ca_anchor_dir)) > 100


def test_the_daemon_logs_a_given_up_directory_once_for_both_parts(hub: str, chain: Chain, tmp_path: Path) -> None:
    """Through the daemon's LeanChild (a real lean child), a damaged directory's fallback comes back in the probe's
    result and is logged as one ``lean_tls_anchors_given_up`` warning naming the directory."""
    import io
    import sys

    from agent.daemon_jobs.children import LeanChild
    from agent.daemon_jobs.protocol import HubProbePlan
    from agent.host import Host
    from agent.log import configure
    from tests.daemon.test_jobs import make_runtime

    ca_file = copy_of(chain.bundle, tmp_path)
    anchors = ensure_anchors(ca_file, str(tmp_path / "anchors"))
    assert anchors is not None
    root_file(chain, anchors).unlink()
    plan = HubProbePlan.from_json(probe_plan(hub, ca_file, anchors))
    stream = io.StringIO()
    configure(level="warning", json_output=True, stream=stream)
    try:
        result = LeanChild(make_runtime(tmp_path, Host()), "").run(plan, None)
    finally:
        configure(level="warning", json_output=True, stream=sys.stderr)
    assert result.probe is not None and result.probe.outcome == "answered"
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]
    given_up = [line for line in lines if line["event"] == "lean_tls_anchors_given_up"]
    assert len(given_up) == 1 and given_up[0]["parts"] == ["probe"] and anchors.directory in given_up[0]["detail"]
