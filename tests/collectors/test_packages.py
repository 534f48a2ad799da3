"""dpkg status parsing, rpm query parsing and the watchlist."""

from __future__ import annotations

import fnmatch

import pytest

from agent.collectors.dpkg import DpkgCollector, parse_dpkg_status
from agent.collectors.packages import Watchlist, find_version
from agent.collectors.rpm import RpmCollector, parse_rpm_query, rpm_query_argv
from agent.defaults import DEFAULT_WATCHED_PATTERNS
from agent.errors import CollectorUnavailable
from agent.host import Host
from tests.fakes.runner import FakeRunner

STATUS = """Package: rocm-core
Status: install ok installed
Architecture: amd64
Version: 6.2.2.60202-116~22.04
Description: ROCm core
 long text
 .
 with a Version: line inside the description

Package: amdgpu-dkms
Status: install ok half-configured
Architecture: all
Version: 1:6.8.5.60202-2041575.22.04

Package: linux-image-6.5.0-35-generic
Status: deinstall ok config-files
Architecture: amd64
Version: 6.5.0-35.35~22.04.1

Package: bash
Status: install ok installed
Architecture: amd64
Version: 5.1-6ubuntu1

Package: libnvidia-compute-580
Status: install ok installed
Architecture: amd64
Version: 580.95.05-0ubuntu1

Package: libnvidia-compute-580
Status: install ok installed
Architecture: i386
Version: 580.95.05-0ubuntu1
"""


def test_parse_dpkg_status_keeps_watched_present_packages() -> None:
    """Watched packages with files on disk are kept with their state; removed ones and unwatched ones are not."""
    parsed = parse_dpkg_status(STATUS, Watchlist())
    assert parsed.installed_count == 5
    assert sorted(parsed.packages) == ["amdgpu-dkms", "libnvidia-compute-580:amd64", "libnvidia-compute-580:i386",
                                       "rocm-core"]
    assert parsed.packages["rocm-core"].version == "6.2.2.60202-116~22.04"
    assert parsed.packages["amdgpu-dkms"].state == "half-configured"
    assert find_version(parsed.packages, "libnvidia-compute-580") == "580.95.05-0ubuntu1"


@pytest.mark.parametrize("name,watched", [
    ("linux-image-6.8.0-45-generic", True), ("amdgpu-dkms", True), ("rocm-hip-runtime", True),
    ("nvidia-driver-580-open", True), ("cuda-toolkit-13-0", True), ("docker-ce", True), ("kernel-core", True),
    ("bash", False), ("libc6", False), ("python3-rocket", False), ("cudatext", False),
])
def test_watchlist(name: str, watched: bool) -> None:
    """The default watchlist covers kernel, driver, ROCm/CUDA and container packages only."""
    assert (name in Watchlist()) is watched


_NAMES = ("linux-image-6.8.0-45-generic", "linux-", "linux", "kernel", "kernel-core", "kernel-", "rocm", "rocminfo",
          "hip-runtime-amd", "hip", "nvidia-driver-580", "cuda", "cuda-13-0", "cudatext", "lib32cuda1", "a?b", "a[b",
          "abc", "x1y", "x.y", "", "Docker-ce", "docker-ce")


@pytest.mark.parametrize("patterns", [
    DEFAULT_WATCHED_PATTERNS,
    ("kernel", "linux-*", "cuda"),                         # names and prefixes only
    ("*cuda*", "x?y", "a[bc]*", "rocm*", "hip"),            # patterns that need fnmatch's full syntax
    ("*",), (),
])
def test_watchlist_matches_as_fnmatch_does(patterns: tuple) -> None:
    """Names, ``prefix*`` and full shell patterns match exactly as ``fnmatch.fnmatchcase`` does."""
    watch = Watchlist(patterns)
    for name in _NAMES + tuple(f"{p}x" for p in patterns):
        assert (name in watch) is any(fnmatch.fnmatchcase(name, p) for p in patterns), (name, patterns)


def test_parse_rpm_query() -> None:
    """rpm's tab-separated query output keeps epochs in the version and skips gpg-pubkey."""
    text = ("kernel-core\t5.14.0-570.12.1.el9_6\tx86_64\n"
            "amdgpu-dkms\t1:6.14.14.30100100-2204008.el9\tnoarch\n"
            "gpg-pubkey\tfd431d51-4ae0493b\t(none)\n"
            "bash\t5.1.8-9.el9\tx86_64\n"
            "garbage line\n")
    parsed = parse_rpm_query(text, Watchlist())
    assert parsed.installed_count == 4
    assert parsed.packages["amdgpu-dkms"].version == "1:6.14.14.30100100-2204008.el9"
    assert "bash" not in parsed.packages and "gpg-pubkey" not in parsed.packages


def test_rpm_collector_absent_without_database(tmp_path) -> None:
    """A Debian host has no rpm database: absent, and rpm is never run."""
    runner = FakeRunner()
    with pytest.raises(CollectorUnavailable):
        RpmCollector().collect(Host(root=tmp_path, runner=runner))
    assert runner.calls == []


def test_rpm_collector_absent_when_rpm_missing(tmp_path) -> None:
    """An rpm database without the rpm program is reported as absent with the reason."""
    (tmp_path / "var/lib/rpm").mkdir(parents=True)
    (tmp_path / "var/lib/rpm/rpmdb.sqlite").write_text("")
    runner = FakeRunner()
    runner.add(rpm_query_argv(str(tmp_path)), not_found=True)
    with pytest.raises(CollectorUnavailable, match="rpm is not installed"):
        RpmCollector().collect(Host(root=tmp_path, runner=runner))


def test_dpkg_collector_absent_without_status(tmp_path) -> None:
    """No dpkg status file means no dpkg database."""
    with pytest.raises(CollectorUnavailable):
        DpkgCollector().collect(Host(root=tmp_path))


def _status_files() -> list:
    from tests.conftest import ROOTS

    return sorted(str(p) for p in ROOTS.glob("*/**/var/lib/dpkg/status"))


ODD_STATUS = [
    STATUS,
    STATUS.replace("Package: bash", "Package:\tbash"),  # not spaced as dpkg writes: the full scan
    "Status: install ok installed\nPackage: rocm-core\nVersion: 1\n\nPackage: bash\nStatus: install ok unpacked\n"
    "Version: 2\n",
    "Package: a\nStatus: purge ok not-installed\n\nPackage: b\nStatus: hold ok triggers-pending\nVersion: 3\n"
    "Description: x\n Status: install ok installed\n",
    "",
]


@pytest.mark.parametrize("text", ODD_STATUS + [open(p, encoding="utf-8", errors="replace").read()
                                               for p in _status_files()])
@pytest.mark.parametrize("patterns", [DEFAULT_WATCHED_PATTERNS, ("bash", "rocm*", "b"), ("linux-image-[0-9]*",)])
def test_bytes_reading_equals_the_full_scan(text: str, patterns: tuple) -> None:
    """The collector's byte search and count give exactly the full parse's package set, odd files included."""
    from agent.collectors.dpkg import dpkg_package_set
    from agent.hostfacts.dpkg_status import count_present, iter_dpkg_status

    watch = Watchlist(patterns)
    assert dpkg_package_set(text.encode("utf-8"), watch) == parse_dpkg_status(text, watch)
    assert count_present(text.encode("utf-8")) == sum(1 for _ in iter_dpkg_status(text))


def test_fixture_status_files_are_found() -> None:
    """The table above reads the fixture roots' real status files, not none."""
    assert _status_files()


def test_watchlist_names_and_prefixes() -> None:
    """Names and prefix patterns come out for the byte search; any other glob needs the full scan."""
    assert Watchlist(["bash", "rocm-*"]).names_and_prefixes == (frozenset({"bash"}), ("rocm-",))
    assert Watchlist(["linux-image-[0-9]*"]).names_and_prefixes is None
