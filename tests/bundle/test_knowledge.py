"""Knowledge tables travelling in signed bundles: a newer dcgm-exporter or TheRock table judges the host, an older
one never replaces the package's, a malformed one is a format refusal (real gpg signatures, the real apt hook)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Tuple

from agent.bundle.format import canonical_bytes
from agent.bundle.state import read_bundle_state
from agent.config import parse_settings
from agent.guard.hotpath import decision as exits
from agent.host import Host
from agent.status.assess import assess
from agent.status.facts import read_policy
from tests.bundle.test_install import PERMISSIVE, Site, run
from tests.guard.apt.test_hook import HEAD, line, run_hook
from tests.status.test_assess import healthy

REPO = Path(__file__).resolve().parents[2]
SHIPPED = (REPO / "policies/knowledge/dcgm-exporter.toml").read_text()
POLICY = '[policy]\nname = "dcgm"\n[companions]\ndcgm_exporter = true\n'
# A host running dcgm-exporter 4.11.0 (newer than the shipped table's newest row, 4.10.0) beside DCGM 4.9.0.
STATUS = "".join(
    f"Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\nDescription: x\n\n"
    for name, version in [("datacenter-gpu-manager-4-core", "1:4.9.0-1"), ("dcgm-exporter", "4.11.0-1")])
# DCGM moved back to 4.8.0 under exporter 4.11.0: only a table that knows 4.11.0 (built with DCGM 4.9.0) refuses it.
DOWNGRADE = HEAD + line("datacenter-gpu-manager-4-core", "1:4.9.0-1", "1:4.8.0-1")
# The row invented for the test: exporter 4.11.0 with DCGM 4.9.0.
ROW_4_11 = ('\n[[row]]\nexporter = "4.11.0"\ndcgm = "4.9.0"\ndcgm_series = ["4.9"]\n'
            'source = "invented for the test (issue 42)"\ndate = "{date}"\n')


def table(dated: str, version: int = 3) -> str:
    """The shipped table with the 4.11.0 row added, dated ``dated`` (every row's date moved to it or before)."""
    text = SHIPPED.replace('dated = "2026-12-06"', f'dated = "{dated}"').replace("version = 2", f"version = {version}")
    text = text.replace('date = "2026-12-06"', f'date = "{min(dated, "2026-12-06")}"')
    text = text.replace('date = "2026-12-04"', f'date = "{min(dated, "2026-12-04")}"')
    return text + ROW_4_11.format(date=dated)


def dcgm_site(tmp_path: Path) -> Site:
    """A bundle-sourced host with DCGM 4.9.0 and exporter 4.11.0, serial 1 (the package's table) in force."""
    site = Site(tmp_path)
    (site.root / "var/lib/dpkg/status").write_text(STATUS)
    code, _, err = site.install(site.bundle(1, POLICY))
    assert code == 0, err
    return site


def knowledge_bundle(site: Site, serial: int, knowledge: str) -> Path:
    """``policy bundle --knowledge`` with this dcgm-exporter.toml, signed by the site's key."""
    (site.policy_dir / "10-site.toml").write_text(POLICY)
    source = site.tmp / f"k{serial}" / "dcgm-exporter.toml"
    source.parent.mkdir()
    source.write_text(knowledge)
    target = site.tmp / f"bundle-{serial}.json"
    code, out, err = run("policy", "bundle", str(site.policy_dir), "--serial", str(serial), "-o", str(target),
                         "--no-host", "--all", "--knowledge", str(source))
    assert code == 0 and "and knowledge dcgm-exporter.toml" in out, out + err
    site.signer.sign(target)
    return target


def explain_and_status(site: Site) -> Tuple[str, str]:
    """``policy explain``'s output and the status policy check's summary."""
    code, out, err = run("policy", "explain", "--root", str(site.root), "--config", str(site.config))
    assert code in (0, 1), err
    facts = read_policy(Host.for_root(str(site.root)), parse_settings(site.config.read_text()).guard,
                        "/var/lib/gpuguard")
    check = next(c for c in assess(healthy(policy=facts)).checks if c.name == "policy")
    return out, check.summary


def test_a_bundle_with_a_newer_row_judges_a_host_the_package_table_does_not_know(tmp_path: Path) -> None:
    """Under the package's table exporter 4.11.0 is "unknown to gpuguard's table" and DCGM may move under it; a
    signed bundle carrying a table dated later with the row 4.11.0 / DCGM 4.9.0 makes the hook refuse that move by
    the row, explain and status name the table from the bundle's serial, and freeze judges with it too."""
    site = dcgm_site(tmp_path)
    out, summary = explain_and_status(site)
    assert "unknown to gpuguard's dcgm-exporter table dated 2026-12-06 (from package;" in out
    assert "dcgm-exporter table version 2 dated 2026-12-06 (from package;" in summary
    code, _ = run_hook(site.root, DOWNGRADE)
    assert code == exits.EXIT_ALLOW

    code, out, err = site.install(knowledge_bundle(site, 2, table("2026-12-20")))
    assert code == 0, err
    assert (site.state / "policy-bundle/knowledge/dcgm-exporter.toml").read_text() == table("2026-12-20")
    compiled = json.loads(site.compiled.read_text())["knowledge"]["dcgm-exporter"]
    assert (compiled["dated"], compiled["origin"], compiled["rows"][-1]["exporter"]) == (
        "2026-12-20", "bundle serial 2", "4.11.0")
    code, output = run_hook(site.root, DOWNGRADE)
    assert code == exits.EXIT_REFUSED, output
    assert "dcgm-exporter 4.11.0 (built with DCGM 4.9.0) needs DCGM 4.9.x" in output
    out, summary = explain_and_status(site)
    assert "unknown to gpuguard" not in out
    assert ("companion.dcgm_exporter: judged by gpuguard's dcgm-exporter table version 3 dated 2026-12-20 (from "
            "bundle serial 2; newest row: exporter 4.11.0 with DCGM 4.9.0)") in out.splitlines()
    assert "dcgm-exporter table version 3 dated 2026-12-20 (from bundle serial 2;" in summary
    (site.root / "var/lib/dpkg/status").write_text(STATUS.replace("1:4.9.0-1", "1:4.8.0-1"))
    code, out, err = run("policy", "freeze", "--root", str(site.root), "--config", str(site.config))
    assert "OFF: the host disagrees now (dcgm-exporter 4.11.0 (built with DCGM 4.9.0) needs DCGM 4.9.x" in out, err


def test_an_older_bundle_table_does_not_replace_the_newer_shipped_one(tmp_path: Path) -> None:
    """A bundle whose table is dated before the package's (even with a row the package lacks) installs, but the
    package's table stays in use: the knowledge never rolls back, and 4.11.0 stays unknown to it."""
    site = dcgm_site(tmp_path)
    code, _, err = site.install(knowledge_bundle(site, 2, table("2026-11-01")))
    assert code == 0, err
    assert (site.state / "policy-bundle/knowledge/dcgm-exporter.toml").is_file()
    compiled = json.loads(site.compiled.read_text())["knowledge"]["dcgm-exporter"]
    assert (compiled["dated"], compiled["origin"]) == ("2026-12-06", "package")
    code, _ = run_hook(site.root, DOWNGRADE)
    assert code == exits.EXIT_ALLOW
    out, summary = explain_and_status(site)
    assert "unknown to gpuguard's dcgm-exporter table dated 2026-12-06 (from package;" in out
    assert "dated 2026-12-06 (from package;" in summary


def test_a_malformed_knowledge_file_is_a_format_refusal_leaving_the_policy_as_it_was(tmp_path: Path) -> None:
    """A signed bundle whose knowledge file has a bad field is refused as ``format``, naming the file and field; the
    compiled policy is byte for byte what it was and nothing of the bundle is installed."""
    site = dcgm_site(tmp_path)
    before = site.compiled.read_bytes()
    good = knowledge_bundle(site, 2, table("2026-12-20"))
    data = json.loads(good.read_bytes())
    data["knowledge"]["dcgm-exporter.toml"] = data["knowledge"]["dcgm-exporter.toml"].replace(
        'dcgm = "4.9.0"', 'dcgm = "4.9"')
    good.write_bytes(canonical_bytes(data))
    site.signer.sign(good)
    code, out, err = site.install(good)
    assert code == 17 and out == "", err
    assert err.startswith(f"gpuguard: error: {good}: refused (format): not a policy bundle: knowledge -> "
                          f"dcgm-exporter.toml: row -> 10 -> dcgm: '4.9' is not a MAJOR.MINOR.PATCH release"), err
    assert err.count("\n") == 1
    assert site.compiled.read_bytes() == before
    assert not (site.state / "policy-bundle/knowledge").exists()
    state = read_bundle_state(str(site.state / "policy-bundle/state.json"))
    assert state.serial == 1 and state.refused is not None and state.refused.kind == "format"


def test_a_first_bundle_carrying_knowledge_is_compiled_with_it(tmp_path: Path) -> None:
    """On a host with no bundle before, the first one's newer table is compiled in, named by its serial."""
    site = Site(tmp_path)
    (site.root / "var/lib/dpkg/status").write_text(STATUS)
    code, _, err = site.install(knowledge_bundle(site, 1, table("2026-12-20")))
    assert code == 0, err
    compiled = json.loads(site.compiled.read_text())["knowledge"]["dcgm-exporter"]
    assert (compiled["dated"], compiled["origin"]) == ("2026-12-20", "bundle serial 1")
    assert run_hook(site.root, DOWNGRADE)[0] == exits.EXIT_REFUSED


def test_policy_bundle_refuses_a_knowledge_file_it_cannot_parse(tmp_path: Path) -> None:
    """``policy bundle --knowledge`` parses the file first: a bad one is one line naming it, and no bundle."""
    site = Site(tmp_path)
    (site.policy_dir / "10-site.toml").write_text(POLICY)
    bad = tmp_path / "dcgm-exporter.toml"
    bad.write_text(SHIPPED.replace("version = 2", "version = -1"))
    target = tmp_path / "b.json"
    code, out, err = run("policy", "bundle", str(site.policy_dir), "--serial", "2", "-o", str(target), "--no-host",
                         "--all", "--knowledge", str(bad))
    assert code == 4 and not target.exists()
    assert err == f"gpuguard: error: {bad}: version: Input should be greater than or equal to 1\n"


THEROCK_SHIPPED = (REPO / "policies/knowledge/therock-releases.toml").read_text()
# A TheRock 10.2 row, newer than the shipped table's newest (10.1).
ROW_10_2 = ('\n[[row]]\nrelease = "10.2"\nreleased = "2026-12"\nsource = "https://github.com/ROCm/TheRock '
            '(invented for the test, issue 42)"\ndate = "{date}"\n')
UNKNOWN_10_2 = "TheRock ROCm 10.2 (amdrocm-base10.2) is unknown to gpuguard's TheRock release table dated 2026-12-06"


def therock_table_text(dated: str) -> str:
    """The shipped TheRock table with the 10.2 row added, dated ``dated`` (every row's date moved to it or before)."""
    text = THEROCK_SHIPPED.replace('dated = "2026-12-06"', f'dated = "{dated}"').replace("version = 1", "version = 2")
    return text.replace('date = "2026-12-06"', f'date = "{min(dated, "2026-12-06")}"') + ROW_10_2.format(date=dated)


def therock_site(tmp_path: Path) -> Site:
    """A bundle-sourced host with an AMD pairing policy that allows any pair in force (serial 1) and TheRock 10.2
    (amdrocm-base10.2) installed beside its stack."""
    site = Site(tmp_path)
    status = site.root / "var/lib/dpkg/status"
    status.write_text(status.read_text().rstrip("\n") + "\n\nPackage: amdrocm-base10.2\nStatus: install ok installed\n"
                      "Architecture: amd64\nVersion: 10.2.0~20261201-1\nDescription: x\n\n")
    code, _, err = site.install(site.bundle(1, PERMISSIVE))
    assert code == 0, err
    return site


def therock_bundle(site: Site, serial: int, knowledge: str) -> Path:
    """``policy bundle --knowledge`` with this therock-releases.toml, signed by the site's key."""
    (site.policy_dir / "10-site.toml").write_text(PERMISSIVE)
    source = site.tmp / f"t{serial}" / "therock-releases.toml"
    source.parent.mkdir()
    source.write_text(knowledge)
    target = site.tmp / f"bundle-{serial}.json"
    code, out, err = run("policy", "bundle", str(site.policy_dir), "--serial", str(serial), "-o", str(target),
                         "--no-host", "--all", "--knowledge", str(source))
    assert code == 0 and "and knowledge therock-releases.toml" in out, out + err
    site.signer.sign(target)
    return target


def explain_lines(site: Site) -> str:
    """``policy explain``'s output (the side-by-side ROCm releases are a violation of the policy: exit 10)."""
    code, out, err = run("policy", "explain", "--root", str(site.root), "--config", str(site.config))
    assert code == 10 and "amd.rocm_side_by_side" in out, out + err
    return out


def tree_findings(site: Site, tmp_path: Path) -> List[Tuple[str, str, Optional[str]]]:
    """The TheRock findings of a snapshot of a host with a /opt/rocm/core-10.2 tree (no package), judged with the
    TheRock table the site's policy source has in force, as the daemon's snapshot job reads it."""
    from agent.bundle.source import policy_source
    from agent.snapshot.take import take_snapshot
    from tests.snapshot.test_unknown_to_table import _host

    settings = parse_settings(site.config.read_text())
    in_force = policy_source(Host.for_root(str(site.root)), settings.guard, settings.agent.state_dir).therock_table()
    snap = take_snapshot(_host(tmp_path / f"tree-{in_force.origin[-1]}", {"10.2": "10.2.0~20261201"}, {}),
                         therock_table=in_force)
    return [(f.details["version"], f.details["table_dated"], f.details.get("table_origin")) for f in snap.findings
            if f.kind == "unknown_to_table" and f.details["table"] == "therock"]


def test_a_bundle_with_a_newer_therock_row_makes_therock_10_2_known(tmp_path: Path) -> None:
    """Under the package's TheRock table (newest 10.1) TheRock 10.2 is "unknown to gpuguard's table", as a package in
    ``policy explain`` and as a tree in the snapshot; a signed bundle carrying the table dated later with a 10.2 row
    is installed beside the policy, compiled in from the bundle's serial, and 10.2 is no longer unknown to either."""
    site = therock_site(tmp_path)
    out = explain_lines(site)
    assert UNKNOWN_10_2 in out
    assert "TheRock release table version 1 dated 2026-12-06 (from package; newest row: 10.1)" in out
    assert tree_findings(site, tmp_path) == [("10.2", "2026-12-06", "package")]

    code, _, err = site.install(therock_bundle(site, 2, therock_table_text("2026-12-20")))
    assert code == 0, err
    assert (site.state / "policy-bundle/knowledge/therock-releases.toml").read_text() == \
        therock_table_text("2026-12-20")
    compiled = json.loads(site.compiled.read_text())["knowledge"]["therock-releases"]
    assert (compiled["dated"], compiled["origin"], compiled["rows"][-1]["release"]) == (
        "2026-12-20", "bundle serial 2", "10.2")
    out = explain_lines(site)
    assert "unknown to gpuguard's TheRock" not in out
    assert "TheRock release table version 2 dated 2026-12-20 (from bundle serial 2; newest row: 10.2)" in out
    assert tree_findings(site, tmp_path) == []


def test_an_older_bundle_therock_table_does_not_replace_the_newer_shipped_one(tmp_path: Path) -> None:
    """A bundle whose TheRock table is dated before the package's (even with a 10.2 row the package lacks) installs,
    but the package's table stays in use: 10.2 stays unknown to it, named with its date and origin."""
    site = therock_site(tmp_path)
    code, _, err = site.install(therock_bundle(site, 2, therock_table_text("2026-11-01")))
    assert code == 0, err
    assert (site.state / "policy-bundle/knowledge/therock-releases.toml").is_file()
    compiled = json.loads(site.compiled.read_text())["knowledge"]["therock-releases"]
    assert (compiled["dated"], compiled["origin"]) == ("2026-12-06", "package")
    out = explain_lines(site)
    assert UNKNOWN_10_2 in out
    assert tree_findings(site, tmp_path) == [("10.2", "2026-12-06", "package")]
