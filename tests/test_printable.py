"""printable(): every control character and terminal escape from outside shown as a visible escape, never obeyed."""

from __future__ import annotations

import io
import json

import pytest

from agent import log
from agent.printable import printable, printable_tree

# What a hostile probe prints to take over a terminal: clear the screen, write the clipboard (OSC 52), ring the bell,
# return to the line's start to overwrite it, an 8-bit CSI, a bidi override, NUL, DEL, a tab.
ATTACKS = {"ESC[2J": "\x1b[2J", "OSC 52": "\x1b]52;c;cm0gLXJmIH4=\x07", "BEL": "\x07", "CR": "done\rPASS",
           "C1 CSI": "\x9b31m", "bidi override": "\u202etxt.exe", "NUL": "a\x00b", "DEL": "\x7f", "TAB": "a\tb",
           "line separator": "a\u2028b"}


def unsafe(text: str, keep_newlines: bool = False) -> list:
    """The characters of ``text`` that a terminal would act on (newline allowed when ``keep_newlines``)."""
    return [c for c in text if (not c.isprintable() and not (keep_newlines and c == "\n"))]


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_every_control_and_format_character_is_escaped(name: str) -> None:
    """Each attack comes out with no character a terminal would act on, and its escapes visible."""
    shown = printable(ATTACKS[name])
    assert unsafe(shown) == [] and "\\" in shown


def test_escapes_are_readable_and_newlines_kept_on_request() -> None:
    """ESC shows as \\x1b, CR as \\r; a newline is escaped on one line and kept with keep_newlines."""
    assert printable("\x1b[2J\r\n") == "\\x1b[2J\\r\\n"
    assert printable("a\x1b\nb", keep_newlines=True) == "a\\x1b\nb"
    assert printable("plain text, ünïcode, 日本") == "plain text, ünïcode, 日本"


def test_printable_tree_escapes_keys_and_values() -> None:
    """Every string of a decoded JSON value is escaped, keys included; numbers and bools are left alone."""
    tree = {"a\x1b": ["x\x07", 1, True, None, {"k": "\r"}]}
    assert printable_tree(tree) == {"a\\x1b": ["x\\x07", 1, True, None, {"k": "\\r"}]}


@pytest.mark.parametrize("json_output", [False, True])
def test_log_lines_carry_no_terminal_escapes(json_output: bool) -> None:
    """A logged value holding ESC[2J and OSC 52 reaches neither the console format nor JSON lines raw."""
    out = io.StringIO()
    log.configure("info", json_output=json_output, stream=out)
    try:
        log.get_logger("test").warning("probe_said", stderr=ATTACKS["ESC[2J"] + ATTACKS["OSC 52"])
    finally:
        log.configure("info")
    line = out.getvalue()
    assert "\x1b" not in line and "\x07" not in line and "probe_said" in line
    if json_output:
        assert json.loads(line)["stderr"].startswith("\\x1b[2J")


def test_a_logged_traceback_keeps_its_lines_and_other_values_do_not() -> None:
    """The console format shows a traceback on its lines; a value with a newline cannot forge a second log line."""
    out = io.StringIO()
    log.configure("info", json_output=False, stream=out)
    try:
        try:
            raise ValueError("bad\x1b[2J")
        except ValueError:
            log.get_logger("test").error("failed_here", detail="one\nfake_event level=info", exc_info=True)
    finally:
        log.configure("info")
    text = out.getvalue()
    assert "\x1b" not in text and "\nfake_event" not in text and "fake_event" in text
    assert "Traceback (most recent call last):\n" in text
