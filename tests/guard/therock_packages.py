"""Fake TheRock ROCm releases (amdrocm-*) for the apt chroot and dnf installroot tests, built from the facts AMD's
packaging shows (../shared/reference/therock-packaging-facts.md, ROCm/TheRock docs/packaging).

Each release is versioned packages holding the content (``amdrocm-base7.13``: rocminfo and the version component,
``amdrocm-amdsmi7.13`` with ``libamd_smi.so.27``, ``amdrocm-runtime7.13`` ...) under ``/opt/rocm/core-X.Y``, with
exact ``=`` dependencies inside the release, and non-versioned meta packages (``amdrocm``, ``amdrocm-core``,
``amdrocm-core-sdk``, ``amdrocm-base``) that depend on the versioned ones at their exact version, so an upgrade of a
meta package pulls the next release in beside the old one. Versions: ``10.0.0-4`` as seen on a TheRock 10.0 host;
``7.13.0-1`` assumed in the same form (deb); rpm ``X.Y.Z`` with an assumed ``1.el9`` release.
"""

from __future__ import annotations

from typing import List, NamedTuple, Tuple

# release -> Debian version; the rpm build of the same release is f"{upstream}-1.el9"
RELEASES = {"7.13": "7.13.0-1", "10.0": "10.0.0-4"}
# versioned component -> the components of its release it depends on (at the exact version)
COMPONENTS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("sysdeps", ()), ("base", ("sysdeps",)), ("runtime", ("base",)), ("amdsmi", ("base",)),
    ("core", ("base", "runtime", "amdsmi")), ("core-sdk", ("core",)))
# non-versioned meta package -> what it depends on (a versioned package of the release, or another meta)
METAS = (("amdrocm-base", "amdrocm-base{r}"), ("amdrocm-core", "amdrocm-core{r}"),
         ("amdrocm-core-sdk", "amdrocm-core-sdk{r}"), ("amdrocm", "amdrocm-core"))


class Package(NamedTuple):
    name: str
    version: str  # upstream version without the revision/release: 7.13.0
    depends: Tuple[str, ...]  # names, each at exactly this package's version
    files: Tuple[Tuple[str, str], ...]  # (absolute path, content)


def release_packages(release: str) -> List[Package]:
    """Every package of one TheRock release (versioned and meta), version-neutral (deb and rpm add their own)."""
    upstream = RELEASES[release].split("-", 1)[0]
    prefix = f"/opt/rocm/core-{release}"
    files = {"base": ((f"{prefix}/.info/version", upstream + "\n"),),
             "amdsmi": ((f"{prefix}/lib/libamd_smi.so.27", "fake libamd_smi, SONAME libamd_smi.so.27\n"),)}
    out = [Package(f"amdrocm-{c}{release}", upstream, tuple(f"amdrocm-{d}{release}" for d in deps), files.get(c, ()))
           for c, deps in COMPONENTS]
    out += [Package(meta, upstream, (target.format(r=release),), ()) for meta, target in METAS]
    return out
