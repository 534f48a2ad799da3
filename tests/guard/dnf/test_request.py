"""The dnf adapter: plugin JSON -> Transaction and keyed installed set (EVR strings, installonly, multilib)."""

from __future__ import annotations

import json

import pytest

from agent.errors import InputFileError
from agent.guard.dnf.request import guess_packages, parse_request, request_document, rpm_evr
from agent.guard.hotpath.transaction import resulting_set
from agent.policy.releases import kernel_release_of

AMD = ("amdgpu-dkms", 1, "6.8.5.60202", "2041575.el9", "noarch")
ROCM = ("rocm-core", 0, "6.2.2.60202", "116.el9", "x86_64")
KERNEL = ("kernel-core", 0, "5.14.0", "427.el9", "x86_64")


def doc(installed, items, **kw) -> str:
    return json.dumps(request_document(installed, items, **kw))


@pytest.mark.parametrize("epoch,version,release,expected", [
    (0, "6.2.2", "1.el9", "6.2.2-1.el9"), ("0", "6.2.2", "1", "6.2.2-1"), (None, "1.0", "1", "1.0-1"),
    ("", "1.0", "1", "1.0-1"), (1, "6.8.5.60202", "2041575.el9", "1:6.8.5.60202-2041575.el9"),
    ("12", "2", "", "12:2"),
])
def test_rpm_evr_writes_the_epoch_only_when_it_is_not_zero(epoch, version, release, expected) -> None:
    """rpm_evr writes epoch:version-release, leaving out a zero or missing epoch and an empty release."""
    assert rpm_evr(epoch, version, release) == expected


def test_upgrade_becomes_one_change_with_old_and_new_evr() -> None:
    """An Upgrade/Upgraded pair is one change keyed by name, rpm scheme, tool dnf."""
    new = ("rocm-core", 0, "6.3.0.60300", "39.el9", "x86_64")
    req = parse_request(doc([AMD, ROCM], [new + ("in", "Upgrade"), ROCM + ("out", "Upgraded")],
                            command_line="dnf upgrade rocm-core"))
    tx = req.transaction
    assert (tx.manager, tx.tool, tx.command_line) == ("rpm", "dnf", "dnf upgrade rocm-core")
    assert [(c.package, c.old_version, c.new_version) for c in tx.changes] == [
        ("rocm-core", "6.2.2.60202-116.el9", "6.3.0.60300-39.el9")]
    assert req.installed == {"amdgpu-dkms": "1:6.8.5.60202-2041575.el9", "rocm-core": "6.2.2.60202-116.el9"}


def test_new_kernel_is_an_install_beside_the_old_one() -> None:
    """Install-only packages are keyed name@EVR, so a new kernel does not replace the running one."""
    new = ("kernel-core", 0, "5.14.0", "570.el9", "x86_64")
    req = parse_request(doc([KERNEL], [new + ("in", "Install")]))
    (change,) = req.transaction.changes
    assert (change.package, change.old_version, change.new_version) == ("kernel-core@5.14.0-570.el9", None,
                                                                          "5.14.0-570.el9")
    after = resulting_set(req.installed, req.transaction)
    assert set(after) == {"kernel-core@5.14.0-427.el9", "kernel-core@5.14.0-570.el9"}
    assert kernel_release_of(change.package, change.new_version, manager="rpm") == "5.14.0-570.el9"


def test_installonly_names_from_the_front_end_are_honoured() -> None:
    """A package the front end names installonly is keyed name@version, so a new one is an install beside the old."""
    vm = ("vm-tools-kmod", 0, "1", "1", "x86_64")
    vm2 = ("vm-tools-kmod", 0, "2", "1", "x86_64")
    req = parse_request(doc([vm], [vm2 + ("in", "Install")], installonly=["vm-tools-kmod"]))
    assert [c.package for c in req.transaction.changes] == ["vm-tools-kmod@2-1"]


def test_oldest_kernel_dropped_by_installonly_limit_is_a_removal() -> None:
    """The oldest kernel that installonly_limit drops is a removal of kernel-core@version."""
    req = parse_request(doc([KERNEL], [KERNEL + ("out", "Removed")]))
    (change,) = req.transaction.changes
    assert change.package == "kernel-core@5.14.0-427.el9" and change.kind == "remove"


def test_multilib_names_are_keyed_by_arch() -> None:
    """A package installed for two architectures is two changes keyed name:arch."""
    a64, a32 = ("glibc", 0, "2.34", "100.el9", "x86_64"), ("glibc", 0, "2.34", "100.el9", "i686")
    new64, new32 = ("glibc", 0, "2.34", "101.el9", "x86_64"), ("glibc", 0, "2.34", "101.el9", "i686")
    req = parse_request(doc([a64, a32], [new64 + ("in", "Upgrade"), a64 + ("out", "Upgraded"),
                                         new32 + ("in", "Upgrade"), a32 + ("out", "Upgraded")]))
    assert sorted(c.package for c in req.transaction.changes) == ["glibc:i686", "glibc:x86_64"]


def test_arch_change_of_a_single_arch_package_is_one_change() -> None:
    """An upgrade that changes the architecture of a single-arch package is one change from the old to the new
    version."""
    old, new = ("hello", 0, "1", "1", "x86_64"), ("hello", 0, "2", "1", "noarch")
    req = parse_request(doc([old], [new + ("in", "Upgrade"), old + ("out", "Upgraded")]))
    assert [(c.package, c.old_version, c.new_version) for c in req.transaction.changes] == [("hello", "1-1", "2-1")]


def test_reinstall_is_a_change_with_equal_versions() -> None:
    """A reinstall is one change of kind reinstall."""
    req = parse_request(doc([ROCM], [ROCM + ("in", "Reinstall"), ROCM + ("out", "Reinstalled")]))
    (change,) = req.transaction.changes
    assert change.kind == "reinstall"


def test_removal_and_obsoletes() -> None:
    """An obsoleting package is an install and the obsoleted one a removal."""
    new = ("rocm-core-new", 0, "6.3.0", "1", "x86_64")
    req = parse_request(doc([ROCM], [new + ("in", "Obsoleting"), ROCM + ("out", "Obsoleted")]))
    assert {c.package: c.kind for c in req.transaction.changes} == {"rocm-core": "remove", "rocm-core-new": "install"}


def test_dnf5_tool_is_kept() -> None:
    """The request's tool (dnf5) is carried into the transaction."""
    assert parse_request(doc([], [ROCM + ("in", "I")], tool="dnf5")).transaction.tool == "dnf5"


@pytest.mark.parametrize("text,fragment", [
    ("", "empty input"),
    ("{", "not valid JSON"),
    ("[1]", "expected a JSON object"),
    ('{"format": 2, "installed": [], "items": []}', "request format 2 is not 1"),
    ('{"format": 1, "installed": {}, "items": []}', "installed: expected a list"),
    ('{"format": 1, "installed": [], "items": [{"name": "x", "version": "1", "direction": "up"}]}',
     "items -> 1 -> direction: 'up'"),
    ('{"format": 1, "installed": [{"name": "x"}], "items": []}', "installed -> 1 -> version: missing"),
    ('{"format": 1, "installed": [{"name": "x", "version": 3}], "items": []}', "expected a string, got int"),
    ('{"format": 1, "installed": [{"name": "x", "version": "1", "epoch": "e"}], "items": []}', "is not a number"),
    ('{"format": 1, "tool": "yum", "installed": [], "items": []}', "tool: 'yum'"),
])
def test_malformed_requests_name_the_field(text: str, fragment: str) -> None:
    """A malformed request is an InputFileError naming its source and the field that is wrong."""
    with pytest.raises(InputFileError) as info:
        parse_request(text, "stdin")
    assert fragment in str(info.value) and str(info.value).startswith("stdin: ")


def test_guess_packages_takes_name_fields_first_and_every_other_word() -> None:
    """A guarded name outside a "name" field (a command line, a document cut short) still reaches the fail-safe."""
    assert guess_packages('{"items": [{"name": "rocm-core", "version": ')[0] == "rocm-core"
    assert "amdgpu-dkms" in guess_packages("garbage amdgpu-dkms 6.10")
    assert "kernel-core" in guess_packages('{"items": [{"name": "vim"}], "command_line": "dnf install kernel-core"')


def test_versions_rpm_does_not_build_are_malformed_input() -> None:
    """A version or release with characters rpm refuses is not what dnf sends: InputFileError, the fail-safe."""
    doc = request_document([], [("kernel-core", 0, "5.14.0;1", "427.el9", "x86_64", "in", "Install")])
    with pytest.raises(InputFileError, match="rpm does not allow"):
        parse_request(json.dumps(doc))
