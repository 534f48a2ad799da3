"""Text from outside made safe to show: control characters and terminal escapes written out as visible escapes.

The one home of this rule. Whatever a less trusted party printed (the health probe runs the host's ML stack as an
unprivileged user; a node reports to the hub) passes through ``printable`` before it reaches a terminal (the
``health run`` table, ``gpuguard status``), the hub's dashboard or a log line: an ``ESC [2J`` would clear the
operator's screen, an OSC 52 sequence write their clipboard, a CR overwrite what the line said, a bidi override
reorder it. Each such character becomes ``\\x1b``, ``\\r``, ``\\u202e``: visible, and harmless.

Standard library only (the hot path may show such text too).
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# C0 controls, DEL, C1 controls (0x9b is an 8-bit CSI), and the invisible format characters that reorder or hide text:
# zero-width marks, bidi embeddings/overrides/isolates, word joiners, line/paragraph separators, the BOM.
_UNSAFE = ([*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0xAD, *range(0x200B, 0x2010), *range(0x2028, 0x202F),
            *range(0x2060, 0x2065), *range(0x2066, 0x2070), 0xFEFF])


def _escape(code: int) -> str:
    char = chr(code)
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_TABLE = {code: _escape(code) for code in _UNSAFE}
_TABLE_KEEP_LINES = {**_TABLE, ord("\n"): "\n"}


def printable(text: str, keep_newlines: bool = False) -> str:
    """``text`` with every control and invisible format character escaped; ``keep_newlines`` leaves ``\\n`` as is."""
    return text.translate(_TABLE_KEEP_LINES if keep_newlines else _TABLE)


def printable_tree(value: object) -> object:
    """A decoded JSON value with ``printable`` applied to every string in it, keys included (lists and dicts copied).

    Recursive: only for values whose nesting is already bounded (agent/strictjson.py).
    """
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [printable_tree(item) for item in value]
    if isinstance(value, dict):
        return {printable(str(key)): printable_tree(item) for key, item in value.items()}
    return value
