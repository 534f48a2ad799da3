"""KEY=value files (os-release, /etc/default/grub, grubenv, dnf.conf)."""

from __future__ import annotations

from agent.hostfacts.keyvalue import parse_key_value_lines


def test_parse_key_value_lines_strips_quotes_and_comments() -> None:
    """Shell-style KEY="value" lines parse; comments and junk are ignored."""
    assert parse_key_value_lines('# c\nA="x y"\nB=\'z\'\njunk\nC=1=2\n') == {"A": "x y", "B": "z", "C": "1=2"}


def test_other_separator() -> None:
    """dnf's and grubenv's files use '=' too, but a caller may name another separator."""
    assert parse_key_value_lines("locklist: /etc/x\n", sep=":") == {"locklist": "/etc/x"}
