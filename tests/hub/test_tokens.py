"""Hub tokens: made once, stored as hashes in a 0600 file, checked in constant time, reloaded when changed."""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
from pathlib import Path

import pytest

from agent.errors import ConfigError, UsageError
from agent.hub.tokens import (
    TokenEntry,
    TokenRegistry,
    add_token,
    bearer_token,
    hash_secret,
    read_tokens_file,
    split_token,
)


def test_add_token_stores_only_a_hash_in_a_0600_file(tmp_path: Path) -> None:
    """add_token writes only the secret's hash, with the selector, to a 0600 file atomically (no temporary file
    left)."""
    path = tmp_path / "etc" / "hub-tokens.json"
    token = add_token(str(path), "host", "gpu-node-01")
    text = path.read_text()
    _, selector, secret = token.split(".")
    assert secret not in text and token not in text
    assert hash_secret(secret) in text and selector in text
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [(t.role, t.subject) for t in read_tokens_file(str(path)).tokens] == [("host", "gpu-node-01")]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".hub-tokens.json.")]  # no temp left


def test_each_token_is_new_and_random(tmp_path: Path) -> None:
    """Twenty tokens added in a row are all different and all well formed."""
    path = str(tmp_path / "t.json")
    tokens = {add_token(path, "host", f"h{i}") for i in range(20)}
    assert len(tokens) == 20 and all(split_token(t) for t in tokens)


def test_a_second_token_for_the_same_host_needs_rotate(tmp_path: Path) -> None:
    """A second token for one host is refused without --rotate; with it the old token stops working."""
    path = str(tmp_path / "t.json")
    old = add_token(path, "host", "h1")
    with pytest.raises(UsageError, match="--rotate"):
        add_token(path, "host", "h1")
    new = add_token(path, "host", "h1", rotate=True)
    registry = TokenRegistry(path)
    assert registry.authenticate_token(old) is None
    assert registry.authenticate_token(new).subject == "h1"
    assert len(read_tokens_file(path).tokens) == 1


def test_a_host_and_a_reader_may_share_a_name(tmp_path: Path) -> None:
    """A host token and a reader token with the same subject both authenticate, each with its own role."""
    path = str(tmp_path / "t.json")
    host = add_token(path, "host", "ops")
    reader = add_token(path, "reader", "ops")
    registry = TokenRegistry(path)
    assert registry.authenticate_token(host).role == "host"
    assert registry.authenticate_token(reader).role == "reader"


@pytest.mark.parametrize("subject", ["", "x" * 129])
def test_subject_length_is_checked(tmp_path: Path, subject: str) -> None:
    """An empty subject or one longer than 128 characters is a UsageError."""
    with pytest.raises(UsageError):
        add_token(str(tmp_path / "t.json"), "host", subject)


@pytest.mark.parametrize("header, token", [
    ("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("BEARER abc", "abc"),
    ("Basic abc", None), ("Bearer", None), ("Bearer   ", None), ("", None), (None, None),
])
def test_bearer_token_parsing(header: str, token: str) -> None:
    """The Authorization header yields the token for any case of 'Bearer' and surrounding spaces, else None."""
    assert bearer_token(header) == token


@pytest.mark.parametrize("token", ["", "gg1", "gg1..secret", "gg2.0123456789abcdef.s", "gg1.0123.s",
                                   "gg1.0123456789abcdef.", "gg1.0123456789abcdef.a.b"])
def test_malformed_tokens_authenticate_nobody(tmp_path: Path, token: str) -> None:
    """A token with a wrong prefix, selector or number of parts authenticates nobody."""
    path = str(tmp_path / "t.json")
    add_token(path, "host", "h1")
    assert TokenRegistry(path).authenticate_token(token) is None


def test_registry_reloads_when_the_file_changes(tmp_path: Path) -> None:
    """A token added after start works once the reload interval has passed."""
    path = str(tmp_path / "t.json")
    add_token(path, "host", "h1")
    now = [0.0]
    registry = TokenRegistry(path, reload_seconds=2.0, monotonic=lambda: now[0])
    later = add_token(path, "host", "h2")
    now[0] = 1.0
    assert registry.authenticate_token(later) is None  # within the interval: not looked at yet
    now[0] = 3.0
    assert registry.authenticate_token(later).subject == "h2"


def test_a_corrupted_file_at_reload_keeps_the_old_tokens(tmp_path: Path) -> None:
    """A tokens file broken after start is not taken: the tokens read before still authenticate."""
    path = tmp_path / "t.json"
    token = add_token(str(path), "host", "h1")
    registry = TokenRegistry(str(path), reload_seconds=0)
    path.write_text("{broken")
    assert registry.authenticate_token(token).subject == "h1"


def test_a_corrupt_file_at_start_is_a_config_error_listing_problems(tmp_path: Path) -> None:
    """A tokens file with invalid entries at start is a ConfigError listing every problem."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": 1, "tokens": [{"selector": "zz", "role": "admin"}]}))
    with pytest.raises(ConfigError) as caught:
        TokenRegistry(str(path))
    assert len(caught.value.problems) >= 3 and "selector" in str(caught.value)


def test_a_missing_file_means_no_tokens(tmp_path: Path) -> None:
    """A tokens file that does not exist gives a registry with no tokens, not an error."""
    assert len(TokenRegistry(str(tmp_path / "absent.json"))) == 0


def test_fixed_entries_registry() -> None:
    """A registry built from entries authenticates the matching secret and refuses one differing in a letter's case."""
    entry = TokenEntry(selector="0123456789abcdef", sha256=hash_secret("s3cret"), role="reader", subject="ops",
                       created_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    registry = TokenRegistry.of_entries([entry])
    assert registry.authenticate("Bearer gg1.0123456789abcdef.s3cret").subject == "ops"
    assert registry.authenticate("Bearer gg1.0123456789abcdef.s3creT") is None
