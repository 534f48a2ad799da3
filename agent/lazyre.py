"""Regular expressions compiled at their first use, not when their module is imported.

``gpuguard snapshot`` imports every collector, and most of their patterns are never matched on a given host (no
CUDA toolkit, no amdgpu cards, no docker daemon.json): compiling them all at import was a measurable part of its
start-up (issue #45). A :class:`LazyPattern` is declared like ``re.compile`` and answers the same calls.
"""

from __future__ import annotations

import re
from typing import Any, Iterator, List, Match, Optional, Pattern

__all__ = ["LazyPattern"]


class LazyPattern:
    """``re.compile(source, flags)`` done at the first match, search or scan, then kept."""

    __slots__ = ("source", "flags", "_compiled")

    def __init__(self, source: str, flags: int = 0) -> None:
        self.source = source
        self.flags = flags
        self._compiled: Optional[Pattern[str]] = None

    def compiled(self) -> Pattern[str]:
        """The compiled pattern (compiled now, the first time)."""
        if self._compiled is None:
            self._compiled = re.compile(self.source, self.flags)
        return self._compiled

    def match(self, text: str) -> Optional[Match[str]]:
        return self.compiled().match(text)

    def fullmatch(self, text: str) -> Optional[Match[str]]:
        return self.compiled().fullmatch(text)

    def search(self, text: str) -> Optional[Match[str]]:
        return self.compiled().search(text)

    def findall(self, text: str) -> List[Any]:
        """As re's: strings, or tuples of the groups when the pattern has several."""
        return self.compiled().findall(text)

    def finditer(self, text: str) -> Iterator[Match[str]]:
        return self.compiled().finditer(text)
