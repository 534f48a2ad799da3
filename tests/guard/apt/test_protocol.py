"""The apt hook protocol-v3 parser: captured input, every action kind, and malformed input."""

from __future__ import annotations

import pytest

from agent.errors import InputFileError, InputNotWhole
from agent.guard.apt.protocol import guess_packages, parse_hook_input, percent_decode
from agent.guard.hotpath.transaction import PackageChange, before_set, resulting_set
from tests.conftest import RECORDED

CAPTURED = (RECORDED / "apt-hook" / "v3-upgrade-rocm-core.txt").read_text()
MIXED = (RECORDED / "apt-hook" / "v3-mixed.txt").read_text()


def test_captured_refused_upgrade_parses_to_one_change() -> None:
    """The input apt sent for 'apt-get install -y rocm-core' in the reference chroot."""
    request = parse_hook_input(CAPTURED)
    assert request.native_arch == "amd64"
    assert request.transaction.command_line == "apt-get install -y rocm-core"
    assert request.transaction.changes == (PackageChange("rocm-core", "6.2.2", "6.3.0", "amd64"),)


def test_install_downgrade_multiarch_and_removal() -> None:
    """New install, downgrade, a foreign-arch copy, and **REMOVE** each become the right change."""
    changes = {c.package: c for c in parse_hook_input(MIXED).transaction.changes}
    assert changes["amdgpu-dkms"] == PackageChange("amdgpu-dkms", None, "6.8.5", "amd64")
    assert changes["rocm-core"] == PackageChange("rocm-core", "6.3.0", "6.2.2", "amd64")
    assert changes["libssl3:i386"].old_version is None
    assert changes["libssl3"].old_version == "3.0.15-1~deb12u1"
    assert changes["old-tool"] == PackageChange("old-tool", "1.0", None, "amd64")
    assert changes["old-tool"].kind == "remove" and changes["amdgpu-dkms"].kind == "install"


def test_config_values_other_than_the_two_used_are_not_kept() -> None:
    """The config dump may hold proxy credentials: only the architecture and the command line survive."""
    request = parse_hook_input(MIXED)
    assert set(request.config) == {"APT::Architecture", "CommandLine::AsString"}
    assert "secret" not in repr(request)


def test_resulting_and_before_sets() -> None:
    """The resulting set applies every change; the before set trusts apt's old versions."""
    tx = parse_hook_input(MIXED).transaction
    installed = {"rocm-core": "6.3.0", "old-tool": "1.0", "libssl3": "3.0.15-1~deb12u1", "vim": "9"}
    after = resulting_set(installed, tx)
    assert after["amdgpu-dkms"] == "6.8.5" and after["rocm-core"] == "6.2.2" and "old-tool" not in after
    assert after["vim"] == "9"
    assert before_set({}, tx)["rocm-core"] == "6.3.0"


def test_percent_decoding() -> None:
    """apt's percent-encoded command line is decoded."""
    assert percent_decode("apt-get%20install%20x%3d1") == "apt-get install x=1"


@pytest.mark.parametrize("text,fragment", [
    ("", "empty input"),
    ("garbage\n\nrocm-core 1 amd64 none < 2 amd64 none x.deb\n", "expected 'VERSION 3'"),
    ("VERSION 2\nAPT::Architecture=amd64\n\nrocm-core 1 < 2 x.deb\n", "hook protocol version 2 cannot be checked"),
    ("/var/cache/apt/archives/linux-image-6.8.0-41-generic_6.8.0-41.41_amd64.deb\n",
     "hook protocol version 1 (one .deb path per line) cannot be checked"),
    ("linux-image-6.8.0-41-generic - - none < 6.8.0-41.41 amd64 none x.deb\n", "line 1: expected 'VERSION 3'"),
    ("VERSION 3\n\nrocm-core 6.2.2 amd64 none < 6.3.0 amd64 none x.deb", "the last line has no newline"),
    ("VERSION 3\n\nrocm-core 6.2.2 amd64 none < 1;6.3.0 amd64 none x.deb\n", "invalid character in version"),
    ("VERSION 3\n\nrocm-core 6.2.2 amd64 none < 1.17.3- amd64 none x.deb\n", "revision number is empty"),
    ("VERSION 3\n\nRocm_core 6.2.2 amd64 none < 6.3.0 amd64 none x.deb\n", "is not a package name"),
    ("VERSION 3\n\nrocm-core 6.2.2 AMD64 none < 6.3.0 amd64 none x.deb\n", "is not an architecture"),
    ("VERSION 3\n\nrocm-core 6.2.2 amd64 odd < 6.3.0 amd64 none x.deb\n", "multi-arch 'odd'"),
    ("VERSION 3\n\nrocm-core 6.2.2 amd64 none < 6.3.0 amd64 none x.rpm\n", "action 'x.rpm'"),
    ("VERSION 3\n\nrocm-core - - none < - - none x.deb\n", "neither an old nor a new version"),
    ("VERSION 4\n\n", "unknown hook protocol version '4'"),
    ("VERSION 3\nAPT::Architecture=amd64\nno equals sign here\n\n", "line 3: not a configuration line"),
    ("VERSION 3\nAPT::Architecture=amd64\n", "no blank line"),
    ("VERSION 3\n\nrocm-core 6.2.2 amd64 none < 6.3.0 amd64 none\n", "line 3: expected 9 fields"),
    ("VERSION 3\n\nrocm-core 6.2.2 amd64 none ~ 6.3.0 amd64 none x.deb\n", "direction '~'"),
])
def test_malformed_input_is_one_clear_error(text: str, fragment: str) -> None:
    """Each malformed input raises InputFileError (exit 4 class) whose message says what is wrong."""
    with pytest.raises(InputFileError) as info:
        parse_hook_input(text, "fd 20")
    assert fragment in str(info.value) and str(info.value).startswith("fd 20: ")


@pytest.mark.parametrize("text,fragment", [
    ("", "empty input"),
    ("VERS", "cut short inside its first line"),
    ("VERSION 3", "the last line has no newline"),
    ("VERSION 3\nAPT::Archi", "the last line has no newline"),
    ("VERSION 3\nAPT::Architecture=amd64\n", "no blank line"),
    ("VERSION 3\n\nrocm-core 6.2.2 amd64 none < 6.3", "the last line has no newline"),
    ("VERSION 3 \n\n", "unknown hook protocol version '3 '"),
    ("VERSION 03\n\n", "unknown hook protocol version '03'"),
    ("\ufeffVERSION 3\n\n", "expected 'VERSION 3'"),
    ("VERSION 3\nAPT::Architecture=amd64\nquiet=\x01\n\n", "line 3: not a configuration line"),
    ("VERSION 3\nAPT::Architecture=amd64\n \n\n", "line 3: not a configuration line"),
    ("VERSION 3\nCommandLine::AsString=apt%20install%20rocm-c\u00f6re\n\n", "line 2: not a configuration line"),
    ("VERSION 3\n\nrocm-core\x00 6.2.2 amd64 none < 6.3.0 amd64 none x.deb\n", "line 3: control characters"),
    ("VERSION 3\n\nrocm-c\u00f6re 6.2.2 amd64 none < 6.3.0 amd64 none x.deb\n", "line 3: control characters or non"),
    ("VERSION 3\n\nrocm-core 6.2.2 amd64 none < 6.3.0 amd64 none /x\x1b[2J.deb\n", "line 3: control characters"),
    ("VERSION 3\n\nrocm-core 6.2.2 amd64 none < 6.3.0 amd64 none /" + "x" * 70000 + ".deb\n", "longer than 65536"),
])
def test_input_not_read_whole_is_input_not_whole(text: str, fragment: str) -> None:
    """Cut, another protocol version, bytes apt never writes, over-long lines: InputNotWhole, so the fail-safe
    refuses whatever names it carries."""
    with pytest.raises(InputNotWhole) as info:
        parse_hook_input(text, "fd 20")
    assert fragment in str(info.value) and str(info.value).startswith("fd 20: ")


@pytest.mark.parametrize("text", [
    "VERSION 3\n\nrocm-core 6.2.2 amd64 none < 1;6.3.0 amd64 none x.deb\n",
    "VERSION 3\n\nrocm-core 6.2.2 amd64 none < 6.3.0 amd64 none\n",
])
def test_a_bad_field_in_a_whole_stream_is_not_input_not_whole(text: str) -> None:
    """A whole stream with one field apt would not write leaves the fail-safe its names: plain InputFileError."""
    with pytest.raises(InputFileError) as info:
        parse_hook_input(text, "fd 20")
    assert not isinstance(info.value, InputNotWhole)


def test_a_local_deb_path_may_carry_non_ascii() -> None:
    """``apt install ./résumé.deb``: non-ASCII in the action's path is apt's and parses."""
    request = parse_hook_input("VERSION 3\n\nvim - - none < 2:9.0 amd64 none /tmp/résumé x.deb\n")
    assert [c.package for c in request.transaction.changes] == ["vim"]


@pytest.mark.parametrize("text,name", [
    ("VERSION 2\nAPT::Architecture=amd64\n\nrocm-core 6.2.2 < 6.3.0 /srv/rocm-core_6.3.0_amd64.deb\n", "rocm-core"),
    ("/var/cache/apt/archives/linux-image-6.8.0-41-generic_6.8.0-41.41_amd64.deb\n", "linux-image-6.8.0-41-generic"),
    ("linux-image-6.8.0-41-generic - - none < 6.8.0-41.41 amd64 none x.deb\n", "linux-image-6.8.0-41-generic"),
    ("VERSION 3\nCommandLine::AsString=apt-get%20install%20amdgpu-dkms\n", "amdgpu-dkms"),
])
def test_guess_packages_from_unparsable_input(text: str, name: str) -> None:
    """The fail-safe sees every name an unparsable input may carry, wherever it stands (no blank line needed)."""
    assert name in guess_packages(text)


def test_guess_skips_apt_config_values_but_reads_the_command_line() -> None:
    """apt's own config names kernel globs (NeverAutoRemove); those are not the transaction, the command line is."""
    text = ("VERSION 2\nAPT::NeverAutoRemove::=^linux-image-.*\nAPT::VersionedKernelPackages::=linux-.*\n"
            "CommandLine::AsString=apt-get%20install%20hello-fake\n\nhello-fake - < 1.0 /x/hello-fake_1.0_all.deb\n")
    names = guess_packages(text)
    assert "hello-fake" in names and not any(n.startswith("linux-image") for n in names)
