"""``KEY=value`` lines as os-release(5), /etc/default/grub, grubenv and dnf.conf write them."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Dict


def parse_key_value_lines(text: str, sep: str = "=") -> Dict[str, str]:
    """Parse ``KEY<sep>value`` lines (shell-style quotes stripped); comments and lines without ``sep`` are skipped."""
    out: Dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or sep not in line:
            continue
        key, _, value = line.partition(sep)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out
