"""`gpuguard hub add-host / add-reader`: the token on stdout once, its hash in the file; known errors one line."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import pytest

from agent.cli import main
from agent.hub.tokens import TokenRegistry


def run(argv, capsys) -> tuple:
    out = io.StringIO()
    code = main(argv, out=out)
    return code, out.getvalue(), capsys.readouterr().err


def test_add_host_prints_a_token_that_authenticates(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """hub add-host prints a token once on stdout, which authenticates as the host, and keeps the file 0600."""
    tokens = tmp_path / "tokens.json"
    code, out, err = run(["hub", "add-host", "gpu-node-01", "--tokens-file", str(tokens)], capsys)
    assert code == 0
    token = out.strip()
    assert TokenRegistry(str(tokens)).authenticate_token(token).subject == "gpu-node-01"
    assert "shown this once" in err and token not in err
    assert stat.S_IMODE(os.stat(tokens).st_mode) == 0o600


def test_add_host_uses_the_configs_tokens_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """hub add-reader writes to the tokens file that hub.toml names."""
    tokens = tmp_path / "from-config.json"
    config = tmp_path / "hub.toml"
    config.write_text(f'tokens_file = "{tokens}"\n')
    code, out, _ = run(["hub", "add-reader", "ops", "--config", str(config)], capsys)
    assert code == 0 and TokenRegistry(str(tokens)).authenticate_token(out.strip()).role == "reader"


def test_adding_a_host_twice_is_a_usage_error_unless_rotated(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Adding a host twice exits 2 with one line pointing to --rotate; with --rotate it prints a new token."""
    tokens = str(tmp_path / "tokens.json")
    run(["hub", "add-host", "h1", "--tokens-file", tokens], capsys)
    code, out, err = run(["hub", "add-host", "h1", "--tokens-file", tokens], capsys)
    assert (code, out) == (2, "")
    assert err.strip().count("\n") == 0 and "--rotate" in err
    code, out, _ = run(["hub", "add-host", "h1", "--tokens-file", tokens, "--rotate"], capsys)
    assert code == 0 and out.strip()


def test_an_explicit_missing_config_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """hub serve --config naming a missing file exits 3 saying so."""
    code, _, err = run(["hub", "serve", "--config", str(tmp_path / "absent.toml")], capsys)
    assert code == 3 and "no such file" in err


def test_add_admin_prints_an_admin_token(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """hub add-admin prints a token that authenticates with the admin role, which may also read."""
    tokens = tmp_path / "tokens.json"
    code, out, err = run(["hub", "add-admin", "alice", "--tokens-file", str(tokens)], capsys)
    principal = TokenRegistry(str(tokens)).authenticate_token(out.strip())
    assert code == 0 and "admin token for 'alice'" in err
    assert principal is not None and (principal.role, principal.subject, principal.can_read) == ("admin", "alice",
                                                                                                 True)
