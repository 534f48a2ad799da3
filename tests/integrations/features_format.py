"""A strict reader of NFD's features.d format, written from its documented rules, for checking what we write.

Rules (docs/integrations.md, from NFD's local source): one ``<namespace>/<name>[=<value>]`` per line, the value
defaulting to ``true``; ``#`` lines are comments except the ``# +expiry-time=<RFC3339>``, ``# +no-label`` and
``# +no-feature`` directives; at most 64 kB per file. Names and values must also be valid Kubernetes labels.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Dict, Optional, Tuple

MAX_BYTES = 64 * 1024
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_PREFIX = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")
_NAME = re.compile(r"[A-Za-z0-9](?:[-_.A-Za-z0-9]*[A-Za-z0-9])?")
_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-_.A-Za-z0-9]*[A-Za-z0-9])?)?")
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})")


class FormatError(AssertionError):
    """The text breaks a rule of the features.d format."""


def parse_features(text: str) -> Tuple[Optional[dt.datetime], Dict[str, str]]:
    """The expiry time (None without one) and the labels of a features file; FormatError on any broken rule."""
    if len(text.encode("utf-8")) > MAX_BYTES:
        raise FormatError(f"{len(text.encode())} bytes, over 64 kB")
    if text and not text.endswith("\n"):
        raise FormatError("last line not terminated")
    expiry: Optional[dt.datetime] = None
    found: Dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            if line.startswith("# +expiry-time="):
                stamp = line[len("# +expiry-time="):]
                if not _RFC3339.fullmatch(stamp):
                    raise FormatError(f"line {number}: expiry {stamp!r} is not RFC 3339")
                if found:
                    raise FormatError(f"line {number}: expiry after labels covers only the lines below it")
                expiry = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            continue
        if not line.strip():
            raise FormatError(f"line {number}: blank line")
        name, _, value = line.partition("=") if "=" in line else (line, "", "true")
        prefix, slash, short = name.rpartition("/")
        if not slash or not _PREFIX.fullmatch(prefix) or len(prefix) > 253:
            raise FormatError(f"line {number}: {name!r} has no valid namespace")
        if len(short) > 63 or not _NAME.fullmatch(short):
            raise FormatError(f"line {number}: {short!r} is not a label name")
        if len(value) > 63 or not _VALUE.fullmatch(value):
            raise FormatError(f"line {number}: {value!r} is not a label value")
        if name in found:
            raise FormatError(f"line {number}: {name} twice")
        found[name] = value
    return expiry, found
