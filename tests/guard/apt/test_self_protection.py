"""The guard protects itself: a transaction that removes gpuguard is named and refused unless explicitly allowed."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from agent.guard.hotpath import decision as exits
from agent.guard.hotpath.overrides import start_window
from tests.guard.apt.test_hook import HEAD, NOW, hook_root, line, run_hook

GPUGUARD_REMOVED = line("gpuguard", "0.1.0-1~deb12", "-", "**REMOVE**")
# What the Debian 12 -> 13 full-upgrade did to the 0.1.0 package (python3 (<< 3.12) cannot stay): gpuguard goes,
# python3 moves to 3.13, and a new kernel arrives in the same transaction.
RELEASE_UPGRADE = (HEAD + GPUGUARD_REMOVED + line("python3", "3.11.2-1+b1", "3.13.5-1")
                   + line("linux-image-6.1.0-28-amd64", "-", "6.1.119-1"))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return hook_root(tmp_path)


def events(root: Path) -> list:
    path = root / "var/lib/gpuguard/guard-events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_removing_gpuguard_is_refused_and_named_as_such(root: Path) -> None:
    """apt-get remove gpuguard: exit 10, one line saying it removes gpuguard itself, the way to allow it, an event."""
    code, out = run_hook(root, HEAD + GPUGUARD_REMOVED)
    assert code == exits.EXIT_REFUSED
    assert "REFUSED (self-protection): this transaction removes gpuguard itself (gpuguard 0.1.0-1~deb12 -> " \
           "(removed))" in out
    assert "--allow-self-removal" in out
    event = events(root)[-1]
    assert event["kind"] == "transaction_blocked" and event["rule"] == "self-protection"
    assert event["packages"] == {"gpuguard": "0.1.0-1~deb12 -> (removed)"}


def test_removal_is_refused_even_without_a_usable_policy(root: Path) -> None:
    """With no compiled policy the fail-safe would let a non-guarded package go; gpuguard's own removal is refused."""
    (root / "var/lib/gpuguard/policy.compiled.json").unlink()
    code, out = run_hook(root, HEAD + GPUGUARD_REMOVED)
    assert code == exits.EXIT_REFUSED and "self-protection" in out


def test_a_window_opened_for_the_kernel_does_not_let_the_guard_go(root: Path) -> None:
    """The release upgrade's transaction under an ordinary override window: refused, and the window is named."""
    state = root / "var/lib/gpuguard"
    start_window(str(state / "overrides.json"), str(state / "audit.log"), minutes=60, reason="kernel 6.12",
                 max_minutes=240, now=lambda: NOW, opened_by="ops")
    code, out = run_hook(root, RELEASE_UPGRADE, now=NOW + dt.timedelta(minutes=5))
    assert code == exits.EXIT_REFUSED
    assert "removes gpuguard itself" in out and "does not cover removing gpuguard" in out
    assert not any(e["kind"] == "override_used" for e in events(root))


def test_a_window_opened_with_allow_self_removal_lets_it_through_audited(root: Path) -> None:
    """--allow-self-removal: the removal passes, and the override_used record names the self-protection rule."""
    state = root / "var/lib/gpuguard"
    start_window(str(state / "overrides.json"), str(state / "audit.log"), minutes=15, reason="decommission",
                 max_minutes=240, now=lambda: NOW, opened_by="ops", allow_self_removal=True)
    code, out = run_hook(root, HEAD + GPUGUARD_REMOVED, now=NOW + dt.timedelta(minutes=1))
    assert code == exits.EXIT_ALLOW and "opened with --allow-self-removal" in out
    used = events(root)[-1]
    assert used["kind"] == "override_used" and used["window"]["allow_self_removal"] is True
    assert used["violations"][0]["rule"] == "self-protection"
    code, _ = run_hook(root, HEAD + GPUGUARD_REMOVED, now=NOW + dt.timedelta(minutes=16))
    assert code == exits.EXIT_REFUSED  # the window expired


def test_upgrading_gpuguard_is_not_self_removal(root: Path) -> None:
    """A new gpuguard build replacing the old one is an ordinary upgrade, not a removal."""
    code, out = run_hook(root, HEAD + line("gpuguard", "0.1.0-1~deb12", "0.1.1-1~deb13"))
    assert code == exits.EXIT_ALLOW and out == ""
