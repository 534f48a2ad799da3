"""iter_named (the hook's C-speed lookup of guarded packages) finds exactly what the full scan finds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.hostfacts.dpkg_status import iter_dpkg_status, iter_named

NAMES = st.sampled_from(["rocm-core", "rocm", "amdgpu-dkms", "amdgpu-dkms-firmware", "linux-image-6.8.0-45-generic",
                         "linux-modules-6.8.0-45-generic", "linux-libc-dev", "libfoo", "dkms", "kernel", "xdkms",
                         "rocm-core-dev"])
STATES = st.sampled_from(["install ok installed", "deinstall ok config-files", "install ok unpacked",
                          "install ok half-configured", "hold ok installed"])
LINES = st.sampled_from(["Description: a package \u00e9t\u00e9", " Package: rocm-core",
                         " with Package: amdgpu-dkms inside", "Depends: amdgpu-dkms-firmware (= 1:6.8.5)",
                         "Architecture: i386", "Architecture: amd64", "Architecture: all", "Multi-Arch: same"])
PREFIXES = st.sampled_from(["rocm", "amdgpu", "amdgpu-dkms", "linux-image-", "linux-modules-", "lib"])


@st.composite
def stanzas(draw: st.DrawFn) -> str:
    name = draw(NAMES)
    spacing = draw(st.sampled_from(["Package: ", "Package: ", "Package: ", "Package:  ", "Package:\t"]))
    fields = [f"{spacing}{name}{draw(st.sampled_from(['', '', ' ']))}", f"Status: {draw(STATES)}"]
    fields += draw(st.lists(LINES, max_size=3))
    if draw(st.booleans()):
        fields.append(f"Version: {draw(st.sampled_from(['1.0-1', '1:6.8.5.60202-2041575.24.04']))}")
    order = draw(st.permutations(fields)) if draw(st.integers(0, 4)) == 0 else fields
    return "\n".join(order)


@settings(max_examples=600, deadline=None)
@given(st.lists(stanzas(), max_size=8), st.sampled_from(["\n\n", "\n\n\n"]), st.booleans(),
       st.lists(NAMES, max_size=2),
       st.lists(PREFIXES, max_size=3),
       st.lists(st.sampled_from(["-dkms", "dkms", "-firmware"]), max_size=2), st.sets(NAMES, max_size=3))
def test_iter_named_agrees_with_the_full_scan(parts: list, separator: str, final_newline: bool, names: list,
                                              prefixes: list, suffixes: list, known: set) -> None:
    """Same packages, versions, architectures and states, in the same order, on generated status files; a
    ``known`` name's native (amd64) or arch-less/all stanza is left out, its foreign (i386) one is not."""
    text = separator.join(parts) + ("\n" if final_newline else "")

    def wanted(name: str) -> bool:
        return name in names or name.startswith(tuple(prefixes)) or name.endswith(tuple(suffixes))

    expected = [row for row in iter_dpkg_status(text, wanted) if not (row[0] in known and row[2] in ("", "all",
                                                                                                 "amd64"))]
    assert list(iter_named(text.encode(), names, prefixes, suffixes, known, "amd64")) == expected


def test_searches_are_merged_only_where_they_still_find_every_name() -> None:
    """Subsumed beginnings go, neighbours sharing five characters are searched by what they share."""
    from agent.hostfacts.dpkg_status import _leads

    assert _leads(["kernel", "kernel-core", "linux-image-", "linux-modules-", "libcuda", "libnvidia-", "rocm"]) == [
        "kernel", "libcuda", "libnvidia-", "linux-", "rocm"]
