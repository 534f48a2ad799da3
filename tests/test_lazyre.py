"""LazyPattern: a regular expression compiled at its first use that answers as ``re.compile``'s would."""

from __future__ import annotations

import re

from agent.lazyre import LazyPattern


def test_lazy_pattern_compiles_at_first_use_and_answers_like_re() -> None:
    """Nothing is compiled at declaration; match, search, fullmatch, findall and finditer agree with re's."""
    lazy = LazyPattern(r"^\s*#\s*define\s+X\s+(\d+)$", re.MULTILINE)
    assert lazy._compiled is None
    eager = re.compile(lazy.source, lazy.flags)
    text = "int a;\n#define X 12\n# define X 7"
    assert lazy.search(text).group(1) == eager.search(text).group(1) == "12"  # type: ignore[union-attr]
    assert lazy.match(text) is None and lazy.fullmatch("#define X 3") is not None
    assert lazy.findall(text) == ["12", "7"]
    assert [m.group(1) for m in lazy.finditer(text)] == ["12", "7"]
    assert lazy.compiled() is lazy.compiled()
