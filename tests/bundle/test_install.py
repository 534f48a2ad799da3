"""``gpuguard policy bundle`` and ``policy install`` with real keys: a good bundle enforced; every bad one refused
with its line (exit 17) while the compiled policy in force keeps the apt hook refusing the same upgrade."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from agent.bundle.format import BUNDLE_FORMAT, BundleScope, PolicyBundle, render_bundle
from agent.bundle.state import read_bundle_state
from agent.cli import main
from agent.config import parse_settings
from agent.guard.hotpath import decision as exits
from agent.host import Host
from agent.status.assess import assess
from agent.status.facts import read_policy
from tests.bundle.keys import Signer
from tests.guard.apt.test_hook import HEAD, POLICY, STATUS, line, run_hook
from tests.status.test_assess import healthy

REPO = Path(__file__).resolve().parents[2]
MATRIX = REPO / "policies/amd-compat-matrix.toml"
# The upgrade the policy refuses: ROCm 6.3 beside the 6.2 driver breaks the pinned pairing.
BREAKING = HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12")
PERMISSIVE = POLICY.replace('name = "rocm-6.2"\namdgpu = "6.2.*"\nrocm = "6.2.*"',
                            'name = "any"\namdgpu = "*"\nrocm = "*"')


def run(*argv: str) -> Tuple[int, str, str]:
    """The CLI in process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(list(argv), out=out)
    return code, out.getvalue(), err.getvalue()


class Site:
    """A host root (dpkg status, trusted key, agent.toml) and an operator's policy.d and signing key."""

    def __init__(self, tmp_path: Path, source: str = "bundle") -> None:
        self.tmp = tmp_path
        self.root = tmp_path / "root"
        (self.root / "var/lib/dpkg").mkdir(parents=True)
        (self.root / "var/lib/dpkg/status").write_text(STATUS)
        (self.root / "etc").mkdir()
        (self.root / "etc/os-release").write_text('ID=debian\nVERSION_ID="12"\n')
        self.config = tmp_path / "agent.toml"
        self.config.write_text(f'[agent]\nstate_dir = "/var/lib/gpuguard"\nhost_id = "node-1"\n'
                               f'labels = {{ rack = "a7" }}\n[guard]\npolicy_source = "{source}"\n')
        self.signer = Signer(tmp_path, "ops")
        self.signer.export(self.root / "etc/gpuguard/keys/ops.gpg")
        self.policy_dir = tmp_path / "policy.d"
        self.policy_dir.mkdir()
        self.state = self.root / "var/lib/gpuguard"
        self.compiled = self.state / "policy.compiled.json"

    def bundle(self, serial: int, policy: str = POLICY, *scope: str, sign: bool = True, name: str = "") -> Path:
        """Write the policy, make a bundle of it (--all unless a scope is given), sign it."""
        (self.policy_dir / "10-site.toml").write_text(policy)
        target = self.tmp / (name or f"bundle-{serial}.json")
        code, out, err = run("policy", "bundle", str(self.policy_dir), "--serial", str(serial), "-o", str(target),
                             "--no-host", "--created-by", "ops@example.com", *(scope or ("--all",)))
        assert code == 0, out + err
        if sign:
            self.signer.sign(target)
        return target

    def hand_made(self, serial: int, files: Dict[str, str]) -> Path:
        """A signed bundle made without ``policy bundle``'s checks (as another tool could make it)."""
        bundle = PolicyBundle(format=BUNDLE_FORMAT, serial=serial, created_at="2026-12-04T23:00:00Z",
                              created_by="elsewhere", scope=BundleScope(all=True), policy_files=files)
        target = self.tmp / f"hand-made-{serial}.json"
        target.write_bytes(render_bundle(bundle))
        self.signer.sign(target)
        return target

    def install(self, bundle: Path, *extra: str) -> Tuple[int, str, str]:
        return run("policy", "install", str(bundle), "--root", str(self.root), "--config", str(self.config), *extra)

    def hook_refuses(self) -> bool:
        code, out = run_hook(self.root, BREAKING)
        return code == exits.EXIT_REFUSED and "REFUSED (amd.pairing)" in out


def test_a_good_bundle_is_enforced(tmp_path: Path) -> None:
    """A signed, in-scope bundle compiles into the policy the hook reads; status of the install is recorded."""
    site = Site(tmp_path)
    code, out, err = site.install(site.bundle(5, POLICY, "--host-id", "node-*", "--label", "rack=a7"))
    assert code == 0, err
    assert out.startswith("installed policy bundle serial 5, policy 'unit', key " + site.signer.fingerprint)
    assert "in force: compiled -> " in out
    assert site.hook_refuses()
    state = read_bundle_state(str(site.state / "policy-bundle/state.json"))
    assert (state.serial, state.fingerprint, state.source, state.refused) == (5, site.signer.fingerprint, "file", None)
    assert sorted(p.name for p in (site.state / "policy-bundle/policy.d").iterdir()) == ["10-site.toml"]
    assert json.loads(site.compiled.read_text())["sources"][0]["path"].endswith("policy-bundle/policy.d/10-site.toml")
    code, out, _ = site.install(tmp_path / "bundle-5.json")
    assert code == 0 and "is installed already: nothing changed" in out
    _, out, err = run("policy", "explain", "--root", str(site.root), "--config", str(site.config))
    assert out.splitlines()[0] == f"policy source: bundle serial 5 from file, key {site.signer.fingerprint}", err


def refusals(site: Site) -> List[Tuple[str, str, Path]]:
    """Each bad bundle with the kind and reason its refusal must give, made after serial 10 is in force."""
    tampered = site.bundle(11, PERMISSIVE, name="tampered.json")
    tampered.write_bytes(tampered.read_bytes().replace(b'"serial":11', b'"serial":12'))
    stranger = Signer(site.tmp, "mallory")
    unknown = site.bundle(13, PERMISSIVE, sign=False, name="unknown.json")
    stranger.sign(unknown)
    return [
        ("signature", "signature: bad signature", tampered),
        ("signature", f"signature: signed by key {stranger.fingerprint[-16:]}, which no trusted keyring holds",
         unknown),
        ("rollback", "serial 9 is below serial 10 in force", site.bundle(9, PERMISSIVE)),
        ("scope", "out of scope: host id node-1 matches none of host_ids [node-2]",
         site.bundle(14, PERMISSIVE, "--host-id", "node-2")),
        ("scope", "out of scope: label rack is 'a7', the bundle is for rack='b1'",
         site.bundle(15, PERMISSIVE, "--label", "rack=b1")),
        ("scope", "out of scope: os debian-12 matches none of os [ubuntu-*]",
         site.bundle(16, PERMISSIVE, "--os", "ubuntu-*")),
        ("compile", "does not compile: policy.d: 10-site.toml: policy -> name: 1 is a number: write a string in "
                    "quotes", site.hand_made(17, {"10-site.toml": "[policy]\nname = 1\n"})),
    ]


def test_every_bad_bundle_is_refused_and_the_old_policy_keeps_guarding(tmp_path: Path) -> None:
    """Tampered, unknown key, older serial, out of scope, does not compile: exit 17 with its line, the compiled
    policy unchanged byte for byte, the hook still refusing the upgrade, the refusal in the state file."""
    site = Site(tmp_path)
    assert site.install(site.bundle(10))[0] == 0
    before = site.compiled.read_bytes()
    assert site.hook_refuses()
    for kind, reason, bundle in refusals(site):
        code, out, err = site.install(bundle)
        assert code == 17 and out == "", (reason, out, err)
        assert err.startswith(f"gpuguard: error: {bundle}: refused ({kind}): {reason}") and err.count("\n") == 1, err
        assert site.compiled.read_bytes() == before
        assert site.hook_refuses(), reason
        state = read_bundle_state(str(site.state / "policy-bundle/state.json"))
        assert state.serial == 10 and state.refused is not None and state.refused.reason.startswith(reason)
        assert state.refused.kind == kind
        assert state.refusal_pending == (state.refused.serial is None or state.refused.serial > 10)
    facts = read_policy(Host.for_root(str(site.root)), parse_settings(site.config.read_text()).guard,
                        "/var/lib/gpuguard")
    check = next(c for c in assess(healthy(policy=facts)).checks if c.name == "policy")
    assert check.state == "warn" and check.summary == (
        f"bundle serial 10 from file, key {site.signer.fingerprint}; gpuguard's compatibility tables: TheRock release "
        f"table version 1 dated 2026-12-06 (from package; newest row: 10.1); serial 17 refused (compile): does not "
        f"compile: "
        f"policy.d: 10-site.toml: policy -> name: 1 is a number: write a string in quotes")


def test_a_bundle_carrying_a_matrix_is_compiled_with_it(tmp_path: Path) -> None:
    """A policy requiring the AMD matrix compiles with the matrix the bundle carries, not the host's."""
    site = Site(tmp_path)
    site.config.write_text(site.config.read_text() + 'matrix_path = "/nonexistent/matrix.toml"\n')
    policy = POLICY.replace('name = "unit"', 'name = "unit"\nrequire_amd_matrix = true')
    (site.policy_dir / "10-site.toml").write_text(policy)
    target = tmp_path / "with-matrix.json"
    code, out, err = run("policy", "bundle", str(site.policy_dir), "--serial", "3", "-o", str(target), "--no-host",
                         "--all", "--matrix", str(MATRIX), "--with-matrix")
    assert code == 0 and "and its matrix" in out, out + err
    carried = json.loads(target.read_bytes())
    assert carried["matrix"] == MATRIX.read_text() and carried["matrix_version"]
    site.signer.sign(target)
    code, out, err = site.install(target)
    assert code == 0, err
    assert json.loads(site.compiled.read_text())["matrix"] is not None
    assert (site.state / "policy-bundle/amd-compat-matrix.toml").read_text() == MATRIX.read_text()


def test_with_local_source_a_bundle_is_kept_but_not_compiled(tmp_path: Path) -> None:
    """Under the default policy_source = "local" an installed bundle is recorded and its policy not compiled."""
    site = Site(tmp_path, source="local")
    code, out, _ = site.install(site.bundle(4))
    assert code == 0 and 'not in force: [guard] policy_source is "local"' in out
    assert not site.compiled.exists()
    assert read_bundle_state(str(site.state / "policy-bundle/state.json")).serial == 4


def test_policy_bundle_checks_first_and_signs_with_gpg(tmp_path: Path) -> None:
    """An invalid policy makes no bundle (exit 3, its problems listed); --sign-with signs with the named key."""
    site = Site(tmp_path)
    (site.policy_dir / "10-site.toml").write_text("[policy]\nname = 1\n")
    target = tmp_path / "b.json"
    code, out, _ = run("policy", "bundle", str(site.policy_dir), "--serial", "1", "-o", str(target), "--no-host",
                       "--all")
    assert code == 3 and "no bundle written" in out and not target.exists()
    (site.policy_dir / "10-site.toml").write_text(POLICY)
    out_stream = io.StringIO()
    code = main(["policy", "bundle", str(site.policy_dir), "--serial", "2", "-o", str(target), "--no-host", "--all",
                 "--sign-with", site.signer.fingerprint],
                make_host=lambda root: Host(env={"GNUPGHOME": str(site.signer.home)}), out=out_stream)
    site.signer.close()  # gpg ran by the CLI, not by the test's Signer: its agent is ended here
    assert code == 0 and f"signed -> {target}.sig" in out_stream.getvalue()
    code, out, err = site.install(target)
    assert code == 0, err


def test_a_scope_without_hosts_is_a_usage_error(tmp_path: Path) -> None:
    """No --all and no selector: exit 2 naming the options."""
    code, _, err = run("policy", "bundle", str(tmp_path), "--serial", "1", "-o", str(tmp_path / "b.json"))
    assert code == 2 and "scope: no hosts" in err


@pytest.mark.parametrize("serial", ["0", "-1"])
def test_a_serial_below_one_is_refused(tmp_path: Path, serial: str) -> None:
    """The bundle's serial starts at 1: a lower one is refused naming the field."""
    site = Site(tmp_path)
    (site.policy_dir / "10-site.toml").write_text(POLICY)
    code, _, err = run("policy", "bundle", str(site.policy_dir), "--serial", serial, "-o", str(tmp_path / "b.json"),
                       "--no-host", "--all")
    assert code == 4 and "serial: Input should be greater than or equal to 1" in err


def test_a_lost_state_file_keeps_the_serial_floor(tmp_path: Path) -> None:
    """With state.json removed (or reset), the bundle file in place still forbids a lower serial; the same bundle
    installs again and writes the state anew; a damaged bundle file with no state refuses, naming both."""
    site = Site(tmp_path)
    assert site.install(site.bundle(10))[0] == 0
    older = site.bundle(9, PERMISSIVE)
    state_file = site.state / "policy-bundle/state.json"
    state_file.unlink()
    code, _, err = site.install(older)
    assert code == 17 and "refused (rollback): serial 9 is below serial 10 in force" in err, err
    assert site.hook_refuses()
    state_file.write_text("{}\n")
    assert site.install(older)[0] == 17
    state_file.unlink()
    code, out, err = site.install(tmp_path / "bundle-10.json")
    assert code == 0 and out.startswith("installed policy bundle serial 10"), out + err
    assert read_bundle_state(str(state_file)).serial == 10
    state_file.unlink()
    (site.state / "policy-bundle/bundle.json").write_bytes(b'{"format": "gpuguard-policy-bun')
    code, _, err = site.install(older)
    assert code == 17 and err.count("\n") == 1, err
    assert "refused (rollback): the serial in force cannot be told: " in err
    assert "remove /var/lib/gpuguard/policy-bundle" in err
    assert site.hook_refuses()


def test_an_operator_rollback_is_explicit_and_audited(tmp_path: Path) -> None:
    """--allow-rollback takes a lower serial (every other check still applies) only with a --reason, and writes
    who, why and both serials to the audit log; without it the lower serial stays refused."""
    site = Site(tmp_path)
    assert site.install(site.bundle(10, PERMISSIVE))[0] == 0
    assert not site.hook_refuses()
    older = site.bundle(9)
    code, _, err = site.install(older, "--allow-rollback")
    assert code == 2 and "--allow-rollback needs a --reason" in err
    stranger = Signer(site.tmp, "mallory")
    forged = site.bundle(8, sign=False, name="forged.json")
    stranger.sign(forged)
    code, _, err = site.install(forged, "--allow-rollback", "--reason", "10 breaks the fabric")
    assert code == 17 and "which no trusted keyring holds" in err
    code, out, err = site.install(older, "--allow-rollback", "--reason", "10 breaks the fabric")
    assert code == 0, err
    assert out.startswith("rolled back from serial 10 to 9 (recorded in ") and "withdraw serial 10 on the hub" in out
    assert site.hook_refuses()
    assert read_bundle_state(str(site.state / "policy-bundle/state.json")).serial == 9
    (line,) = [entry for entry in map(json.loads, (site.state / "audit.log").read_text().splitlines())
               if entry["event"] == "policy_bundle_rolled_back"]
    assert (line["event"], line["from_serial"], line["to_serial"], line["reason"], line["key"]) == (
        "policy_bundle_rolled_back", 10, 9, "10 breaks the fabric", site.signer.fingerprint)
    assert line["by"]


def test_an_install_clears_the_refusal_before_it(tmp_path: Path) -> None:
    """A refusal holding no verified serial (a bundle whose signature fails, whatever the hub claimed for it, or an
    unreadable file) records none and is attention only until the next install."""
    from agent.bundle.install import BundleInstaller
    from agent.bundle.scope import ScopeFacts
    from agent.errors import BundleRefused

    site = Site(tmp_path)
    assert site.install(site.bundle(10))[0] == 0
    state_file = str(site.state / "policy-bundle/state.json")
    installer = BundleInstaller(Host.for_root(str(site.root)), parse_settings(site.config.read_text()).guard,
                                "/var/lib/gpuguard")
    with pytest.raises(BundleRefused, match="holds no OpenPGP signature"):
        installer.install(b"{}", b"garbage", origin="hub bundle serial 9223372036854775807", source="hub",
                          facts=lambda: ScopeFacts(host_id="node-1"))
    state = read_bundle_state(state_file)
    assert state.refusal_pending and state.refused is not None and state.refused.serial is None
    assert state.refused.kind == "signature"
    assert site.install(site.bundle(11, PERMISSIVE))[0] == 0
    state = read_bundle_state(state_file)
    assert (state.serial, state.refused, state.refusal_pending) == (11, None, False)
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"not a bundle")
    (tmp_path / "garbage.json.sig").write_bytes(b"not a signature")
    assert site.install(garbage)[0] == 17
    assert read_bundle_state(state_file).refusal_pending
    assert site.install(site.bundle(12))[0] == 0
    assert not read_bundle_state(state_file).refusal_pending and site.hook_refuses()
