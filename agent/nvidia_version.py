"""Reading the loaded NVIDIA kernel module's version with the standard library only.

Shared by the nvidia collector and the guard's decision (the apt hook's and dnf checker's hot path): it must never
import pydantic or structlog.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Optional, Tuple


def _dotted(token: str) -> bool:
    parts = token.split(".")
    return len(parts) >= 2 and all(p.isdigit() for p in parts)


def parse_proc_driver_version(text: str) -> Tuple[Optional[str], Optional[str]]:
    """(driver version, module flavor ``open``/``proprietary``) from /proc/driver/nvidia/version.

    ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...`` is the open module,
    ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 ...`` the proprietary one.
    """
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep or key.strip() != "NVRM version":
            continue
        version = next((token for token in value.split() if _dotted(token)), None)
        flavor = None
        if "Open Kernel Module" in value:
            flavor = "open"
        elif "Kernel Module" in value:
            flavor = "proprietary"
        return version, flavor
    return None, None
