"""`gpuguard hub policy push|list|show|withdraw` against a real hub process on 127.0.0.1: answers printed, every
refusal one line with exit 10, a missing URL or token a usage error."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from agent.cli import main
from agent.hub.tokens import add_token
from tests.hub.process import HubProcess, write_config
from tests.hub.signing import keys_dir, signature_of
from tests.hub.test_policy_bundles import bundle_bytes

pytestmark = pytest.mark.slow  # a real hub process per test: left out of `make test-fast`


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    """A hub process over SQLite that trusts the keyrings in its ``keys_dir`` (the shared test key's at first: a
    test adds its own signers' there)."""
    tokens_file = tmp_path / "tokens.json"
    keys = tmp_path / "hub-keys"
    keys.mkdir()
    shutil.copy(Path(keys_dir()) / "release.gpg", keys / "release.gpg")
    config = write_config(tmp_path / "hub.toml", listen_host="127.0.0.1", listen_port=0,
                          database_url=f"sqlite:///{tmp_path}/hub.db", tokens_file=tokens_file,
                          tokens_reload_seconds=0, shutdown_timeout_seconds=5, policy_keys_dir=keys)
    process = HubProcess(config).start()
    process.tokens_file = tokens_file  # type: ignore[attr-defined]
    process.keys_dir = keys  # type: ignore[attr-defined]
    yield process
    process.stop()


@pytest.fixture
def admin_file(hub: HubProcess, tmp_path: Path) -> Path:
    """An admin token in a 0600 file."""
    path = tmp_path / "admin.token"
    path.write_text(add_token(str(hub.tokens_file), "admin", "alice") + "\n")  # type: ignore[attr-defined]
    os.chmod(path, 0o600)
    return path


def bundle_file(tmp_path: Path, serial: int) -> Path:
    path = tmp_path / f"policy-{serial}.json"
    path.write_bytes(bundle_bytes(serial))
    (tmp_path / f"policy-{serial}.json.sig").write_bytes(signature_of(bundle_bytes(serial)))
    return path


def run(argv: List[str], capsys: pytest.CaptureFixture) -> Tuple[int, str, str]:
    out = io.StringIO()
    code = main(argv, out=out)
    return code, out.getvalue(), capsys.readouterr().err


def test_push_list_show_withdraw_round_trip(hub: HubProcess, admin_file: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    """An admin pushes a bundle (its .sig beside it), lists and shows it, withdraws it; list then says withdrawn."""
    common = ["--hub", hub.url, "--token-file", str(admin_file)]
    code, out, err = run(["hub", "policy", "push", str(bundle_file(tmp_path, 3)), *common], capsys)
    assert code == 0 and out.startswith("pushed bundle serial 3 (sha256 "), err
    code, out, _ = run(["hub", "policy", "list", *common], capsys)
    assert code == 0 and "offered" in out.splitlines()[1] and "alice" in out and "all hosts" in out
    code, out, _ = run(["hub", "policy", "show", "3", *common], capsys)
    assert code == 0 and "policy_files:   10-pairing.toml" in out and "created_by" not in out
    code, out, _ = run(["hub", "policy", "withdraw", "3", *common], capsys)
    assert code == 0 and out.startswith("withdrew bundle serial 3")
    code, out, _ = run(["hub", "policy", "list", "--json", *common], capsys)
    assert code == 0 and json.loads(out)["bundles"][0]["withdrawn_by"] == "alice"


def test_refusals_are_one_line_with_exit_10(hub: HubProcess, admin_file: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A serial already stored is 409, a reader's push 403, each one line naming the hub's reason, exit 10."""
    bundle = str(bundle_file(tmp_path, 4))
    assert run(["hub", "policy", "push", bundle, "--hub", hub.url, "--token-file", str(admin_file)], capsys)[0] == 0
    code, _, err = run(["hub", "policy", "push", bundle, "--hub", hub.url, "--token-file", str(admin_file)], capsys)
    assert code == 10 and "HTTP 409 serial_not_newer: serial 4 is not above 4" in err and len(err.splitlines()) == 1
    monkeypatch.setenv("GPUGUARD_HUB_URL", hub.url)
    monkeypatch.setenv("GPUGUARD_HUB_TOKEN", add_token(str(hub.tokens_file), "reader", "ops"))  # type: ignore[attr-defined]
    code, _, err = run(["hub", "policy", "push", str(bundle_file(tmp_path, 5))], capsys)
    assert code == 10 and "HTTP 403 forbidden: a reader token cannot change policy bundles" in err
    assert len(err.splitlines()) == 1
    code, out, _ = run(["hub", "policy", "list"], capsys)  # a reader may list
    assert code == 0 and "       4  offered" in out


def test_missing_url_token_or_file_and_an_unreachable_hub(tmp_path: Path, admin_file: Path,
                                                          capsys: pytest.CaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """No URL is exit 2, no signature file exit 4 naming it, a hub that does not listen exit 10 'unreachable'."""
    monkeypatch.delenv("GPUGUARD_HUB_URL", raising=False)
    code, _, err = run(["hub", "policy", "list", "--token-file", str(admin_file)], capsys)
    assert code == 2 and "no hub URL" in err
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    bundle = tmp_path / "lonely.json"
    bundle.write_bytes(bundle_bytes(9))
    code, _, err = run(["hub", "policy", "push", str(bundle), "--hub", closed, "--token-file", str(admin_file)],
                       capsys)
    assert code == 4 and "lonely.json.sig" in err and len(err.splitlines()) == 1
    code, _, err = run(["hub", "policy", "list", "--hub", closed, "--token-file", str(admin_file)], capsys)
    assert code == 10 and "unreachable" in err and len(err.splitlines()) == 1
