"""How an installed set names a package, and the package name back from such a key.

A key is the package name, ``name:arch`` for a foreign architecture (dpkg) or the 32-bit twin of a multilib package
(rpm), or ``name@version`` for a package installed side by side with its other versions (rpm install-only packages
such as kernels). The hook, the checkers, the collectors, rollback and the policy all key sets this way.
Standard library only, no imports: the apt hook uses it.
"""

from __future__ import annotations


def package_key(name: str, arch: str, native_arch: str = "") -> str:
    """How a dpkg package is named in an installed set: ``name``, or ``name:arch`` for a foreign architecture."""
    if not arch or arch in ("all", "-", "none") or not native_arch or arch == native_arch:
        return name
    return f"{name}:{arch}"


def package_name(key: str) -> str:
    """The package name of a key (``kernel@6.1.0-1`` -> ``kernel``, ``libfoo:i386`` -> ``libfoo``)."""
    return key.split("@", 1)[0].split(":", 1)[0]
