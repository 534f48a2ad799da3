"""The rpm backend over fake roots and recorded dnf/rpm output: installed set, plans, cache, lock waiting."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from agent.config import Settings
from agent.errors import CommandTimeout
from agent.guard.dnf.backend import RpmBackend
from agent.guard.dnf.rpm_cache import RpmCache
from agent.guard.dnf.rpm_rebuild import query_format
from agent.guard.dnf.tool import (
    DnfTool,
    dnf5_do_args,
    nevra,
    parse_rpm_installed,
    parse_transaction,
    plan_problems,
    render_script,
    rpm_file_name,
    split_nevra,
)
from agent.guard.installed import detect_manager
from agent.guard.manager import backend_for
from agent.guard.rollback.backend import InstalledPackage, PlannedStep
from agent.guard.rollback.core import load_known_good
from agent.guard.rollback.kept import KeptFile, Manifest, settle
from agent.host import CommandResult, Host
from agent.hostfacts.rpmdb import RPM_QUERY_FORMAT
from agent.policy.load import compiled_from, load_policy
from agent.statepaths import StatePaths
from tests.conftest import fixed_clock
from tests.fakes.runner import FakeRunner
from tests.guard.wiring import check

GUARDED = ["amdgpu-dkms", "rocm-core", "kernel", "kernel-core", "hello*"]
D62, D63, R62 = "1:6.8.5.60202-2041575.el9", "1:6.10.5.60300-2084815.el9", "6.2.2.60202-116.el9"
RPM_QA = (f"amdgpu-dkms\t{D62}\tnoarch\tamdgpu-dkms,\n"
          f"rocm-core\t{R62}\tx86_64\trocm-core,rocm-core(x86-64),\n"
          "kernel-core\t5.14.0-427.el9\tx86_64\tinstallonlypkg(kernel),kernel-core,\n"
          "kernel-core\t5.14.0-570.el9\tx86_64\tinstallonlypkg(kernel),kernel-core,\n"
          "kernel\t5.14.0-427.el9\tx86_64\tkernel,\n"
          "hello\t1.0-1\tx86_64\thello,\n"
          "hello\t1.0-1\ti686\thello,\n"
          "bash\t5.1.8-6.el9\tx86_64\tbash,\n"
          "gpg-pubkey\tfd431d51-4ae0493b\t(none)\t\n")
ASSUMENO = """\
Dependencies resolved.
================================================================================
 Package                         Arch      Version                 Repository  Size
================================================================================
Removing:
 kernel-core                     x86_64    5.14.0-570.el9          @System      0
Downgrading:
 amdgpu-dkms                     noarch    1:6.8.5.60202-2041575.el9
                                                                   @commandline 5.4 k
 a-very-long-package-name-that-dnf-wraps-onto-the-next-line
                                 x86_64    2.0-1                   fake         6 k
     replacing  old-thing.x86_64 1.0-1

Transaction Summary
================================================================================
Remove     1 Package
Downgrade  2 Packages

Operation aborted.
"""


def test_installed_keys_kernels_by_version_and_the_32_bit_twin_by_arch() -> None:
    """Install-only packages (by name or by installonlypkg provides) are name@version; i686 twins name:i686."""
    got = parse_rpm_installed(RPM_QA, GUARDED)
    assert got == {"amdgpu-dkms": InstalledPackage(D62, "noarch"), "rocm-core": InstalledPackage(R62, "x86_64"),
                   "kernel-core@5.14.0-427.el9": InstalledPackage("5.14.0-427.el9", "x86_64"),
                   "kernel-core@5.14.0-570.el9": InstalledPackage("5.14.0-570.el9", "x86_64"),
                   "kernel@5.14.0-427.el9": InstalledPackage("5.14.0-427.el9", "x86_64"),
                   "hello": InstalledPackage("1.0-1", "x86_64"), "hello:i686": InstalledPackage("1.0-1", "i686")}


@pytest.mark.parametrize("name,version,arch,want_nevra,want_file", [
    ("amdgpu-dkms", D62, "noarch", f"amdgpu-dkms-{D62}.noarch", "amdgpu-dkms-6.8.5.60202-2041575.el9.noarch.rpm"),
    ("rocm-core", R62, "x86_64", f"rocm-core-{R62}.x86_64", f"rocm-core-{R62}.x86_64.rpm"),
    ("x", "1-2", "", "x-1-2", "x-1-2.noarch.rpm"),
])
def test_nevra_and_file_names(name: str, version: str, arch: str, want_nevra: str, want_file: str) -> None:
    """nevra() and rpm_file_name() spell a package as dnf and rpm do, and split_nevra() reads both back."""
    assert nevra(name, version, arch) == want_nevra
    assert rpm_file_name(name, version, arch) == want_file
    assert split_nevra(want_nevra)[0] == name and split_nevra("/c/" + want_file)[:2] == (name, version.split(":")[-1])


def test_parse_transaction_reads_sections_and_wrapped_rows() -> None:
    """dnf's table: one step per row, long names wrapped onto the next line, 'replacing' lines skipped."""
    assert parse_transaction(ASSUMENO) == [
        PlannedStep("remove", "kernel-core", "5.14.0-570.el9", ""),
        PlannedStep("downgrade", "amdgpu-dkms", "", D62),
        PlannedStep("downgrade", "a-very-long-package-name-that-dnf-wraps-onto-the-next-line", "", "2.0-1")]


def test_plan_problems_name_missing_and_extra_moves() -> None:
    """A target dnf did not plan, and a package dnf would move that nobody asked for, are both reported."""
    plan = parse_transaction(ASSUMENO)
    targets = [f"install /c/{rpm_file_name('amdgpu-dkms', D62, 'noarch')}", "remove kernel-core-5.14.0-570.el9.x86_64"]
    assert plan_problems(targets, plan) == [
        "dnf would also change a-very-long-package-name-that-dnf-wraps-onto-the-next-line"]
    assert plan_problems([*targets, "install rocm-core-6.2.2.60202-116.el9.x86_64"], plan[:2]) == [
        "'install rocm-core-6.2.2.60202-116.el9.x86_64' is not in dnf's plan"]


def test_render_script_puts_every_local_file_on_the_first_line_quoted() -> None:
    """dnf shell takes local files only before other jobs; paths are shlex-quoted."""
    script = render_script(["install rocm-core-1-1.x86_64", "install /a b/x-1-1.noarch.rpm", "remove k-2-1.x86_64",
                            "install /c/y-1-1.noarch.rpm"])
    assert script == ("install '/a b/x-1-1.noarch.rpm' /c/y-1-1.noarch.rpm\ninstall rocm-core-1-1.x86_64\n"
                      "remove k-2-1.x86_64\n")


def _rpm_root(tmp_path: Path, rpm_qa: str = RPM_QA):
    root = tmp_path / "root"
    (root / "var/lib/rpm").mkdir(parents=True)
    (root / "var/lib/rpm/rpmdb.sqlite").write_bytes(b"")
    runner = FakeRunner()
    host = Host(root=root, runner=runner, clock=fixed_clock)
    tool = DnfTool(host, lock_timeout_seconds=1, options=["-c", "/etc/test-dnf.conf"])
    runner.add(tool.rpm_argv("-qa", "--qf", RPM_QUERY_FORMAT), stdout=rpm_qa)
    return root, host, tool, runner


def test_argv_uses_installroot_for_a_foreign_root_and_the_backend_is_picked_from_the_rpmdb(tmp_path: Path) -> None:
    """dnf runs with --installroot for a foreign root, and the backend follows the package database found there."""
    root, host, tool, _ = _rpm_root(tmp_path)
    assert tool.argv("shell", "x") == ["dnf", f"--installroot={root}", "-c", "/etc/test-dnf.conf", "shell", "x"]
    assert DnfTool(Host.for_root("/")).argv("upgrade") == ["dnf", "upgrade"]
    assert detect_manager(host) == "rpm" and isinstance(backend_for(host, Settings().guard, StatePaths()), RpmBackend)
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("")
    assert detect_manager(host) == "dpkg"


def test_simulate_refuses_a_script_dnf_could_not_resolve_completely(tmp_path: Path) -> None:
    """dnf shell carries on after a line it cannot resolve; the plan is refused instead of run half."""
    _, host, tool, runner = _rpm_root(tmp_path)
    script = str(host.path(tool.script_path))
    runner.add(tool.argv("--assumeno", "shell", script), returncode=1,
               stdout=ASSUMENO.split("Downgrading:")[0] + "\nTransaction Summary\nOperation aborted.\n",
               stderr="No match for argument: amdgpu-dkms-1:6.8.5.60202-2041575.el9.noarch\n")
    plan, error = tool.simulate(["install amdgpu-dkms-1:6.8.5.60202-2041575.el9.noarch",
                                 "remove kernel-core-5.14.0-570.el9.x86_64"])
    assert error == ("dnf could not plan the rollback: No match for argument: "
                     "amdgpu-dkms-1:6.8.5.60202-2041575.el9.noarch")
    assert Path(script).read_text().startswith("install amdgpu-dkms")


def test_apply_reports_a_line_dnf_skipped_even_with_exit_0(tmp_path: Path) -> None:
    """A dnf shell run that exits 0 but could not find a package is reported as failed with dnf's line."""
    _, host, tool, runner = _rpm_root(tmp_path)
    runner.add(tool.argv("-y", "shell", str(host.path(tool.script_path))), returncode=0,
               stdout="Complete!\n", stderr="Error: Unable to find a match: x-1-1.noarch\n")
    assert tool.apply(["install x-1-1.noarch"]) == "dnf shell failed (exit 0): Error: Unable to find a match: " \
                                                   "x-1-1.noarch"


POLICY = """
[policy]
name = "rb"
[amd]
action = "rollback"
[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"
kernels = ["5.14.0-427.*"]
"""


def test_check_records_then_plans_a_rollback_from_cached_rpms(tmp_path: Path) -> None:
    """First check records the known-good set (caching .rpm files); a forced driver and kernel are then planned
    back as one dnf shell script: cached file first, the new kernel removed."""
    qa_good = "\n".join(line for line in RPM_QA.splitlines() if "570" not in line) + "\n"
    root, host, tool, runner = _rpm_root(tmp_path, qa_good)
    policy_file = tmp_path / "p.toml"
    policy_file.write_text(POLICY)
    policy = compiled_from(load_policy(str(policy_file)))
    rpms = StatePaths().rpms
    dnf_cache = root / "var/cache/dnf/fake-1234/packages"
    dnf_cache.mkdir(parents=True)
    (dnf_cache / rpm_file_name("amdgpu-dkms", D62, "noarch")).write_bytes(b"rpm")
    for name, version, arch in (("rocm-core", R62, "x86_64"), ("kernel-core", "5.14.0-427.el9", "x86_64"),
                                ("kernel", "5.14.0-427.el9", "x86_64"), ("hello", "1.0-1", "x86_64"),
                                ("hello", "1.0-1", "i686")):
        runner.add(tool.argv("-q", "download", "--destdir", str(host.path(rpms)), nevra(name, version, arch)),
                   returncode=1, stderr="No such command: download")
        runner.add(tool.argv("-q", "repoquery", "--location", nevra(name, version, arch)), stdout="")
        # rpm has no header to rebuild from here (the chroot's rpm database is not real)
        runner.add(tool.rpm_argv("-q", "--qf", query_format(), nevra(name, version, arch)), returncode=1,
                   stdout=f"package {nevra(name, version, arch)} is not installed\n")
    runner.add(tool.rpm_argv("-Va", "--nofiles", "--nodigest", "--nosignature"), stdout="")  # consistent
    backend = RpmBackend(host, tool, rpms)
    settings = Settings()
    assert check(host, settings, policy=policy, backend=backend).status == "recorded"
    known_good = load_known_good(host, StatePaths())
    assert known_good["kernel-core@5.14.0-427.el9"].version == "5.14.0-427.el9"
    assert [p.name for p in (root / rpms.lstrip("/")).glob("*.rpm")] == [rpm_file_name("amdgpu-dkms", D62, "noarch")]
    forced = RPM_QA.replace(f"amdgpu-dkms\t{D62}", f"amdgpu-dkms\t{D63}")
    runner.add(tool.rpm_argv("-qa", "--qf", RPM_QUERY_FORMAT), stdout=forced)
    cached = str(host.path(f"{rpms}/{rpm_file_name('amdgpu-dkms', D62, 'noarch')}"))
    runner.add(tool.argv("--assumeno", "shell", str(host.path(tool.script_path))), returncode=1,
               stdout=ASSUMENO.replace(" a-very-long-package-name-that-dnf-wraps-onto-the-next-line\n"
                                       "                                 x86_64    2.0-1                   fake"
                                       "         6 k\n", ""))
    planned = check(host, settings, policy=policy, backend=backend, dry_run=True)
    assert planned.status == "planned", planned.summary()
    assert planned.targets == [f"install {cached}", "remove kernel-core-5.14.0-570.el9.x86_64"]
    assert planned.to_versions == {"amdgpu-dkms": D62, "kernel-core@5.14.0-570.el9": "(removed)"}
    assert planned.reboot_required
    assert (root / "var/lib/gpuguard/rollback.dnf").read_text() == \
        f"install {cached}\nremove kernel-core-5.14.0-570.el9.x86_64\n"


class _DownloadingRunner(FakeRunner):
    """Replays recordings; a ``dnf download`` also leaves the named file in --destdir, as dnf does."""

    def __call__(self, argv, timeout_seconds: float) -> CommandResult:  # type: ignore[no-untyped-def]
        result = super().__call__(argv, timeout_seconds)
        if "download" in argv and result.returncode == 0:
            dest = Path(argv[argv.index("--destdir") + 1])
            name, evr, arch = split_nevra(argv[-1])
            (dest / f"{name}-{evr}.{arch}.rpm").write_bytes(b"downloaded")
        return result


def test_rpm_cache_downloads_then_copies_a_file_repository_then_prunes(tmp_path: Path) -> None:
    """dnf download first; without it, the file a file:// repository serves; files no kept set references go."""
    root = tmp_path / "root"
    root.mkdir()
    runner = _DownloadingRunner()
    host = Host(root=root, runner=runner)
    tool = DnfTool(host)
    cache = RpmCache(host, "/var/lib/gpuguard/rpms", tool)
    dest = str(host.path(cache.directory))
    runner.add(tool.argv("-q", "download", "--destdir", dest, "a-1-1.noarch"))
    manifest = Manifest()
    assert cache.ensure("a", "1-1", "noarch", manifest) == KeptFile("/var/lib/gpuguard/rpms/a-1-1.noarch.rpm",
                                                                    "repository")
    repo = tmp_path / "my repo"
    repo.mkdir()
    (repo / "b-2-1.x86_64.rpm").write_bytes(b"from the repo")
    runner.add(tool.argv("-q", "download", "--destdir", dest, "b-2-1.x86_64"), returncode=1, stderr="no plugin")
    runner.add(tool.argv("-q", "repoquery", "--location", "b-2-1.x86_64"),
               stdout=f"file://{str(repo).replace(' ', '%20')}/b-2-1.x86_64.rpm\n")
    assert cache.ensure("b", "2-1", "x86_64", manifest).restorable and cache.has("b", "2-1", "x86_64")
    assert (root / "var/lib/gpuguard/rpms/b-2-1.x86_64.rpm").read_bytes() == b"from the repo"
    runner.add(tool.argv("-q", "download", "--destdir", dest, "c-1-1.noarch"), returncode=1)
    runner.add(tool.argv("-q", "repoquery", "--location", "c-1-1.noarch"), stdout="")
    runner.add(tool.rpm_argv("-q", "--qf", query_format(), "c-1-1.noarch"), returncode=1)
    assert cache.ensure("c", "1-1", "noarch", manifest).path is None
    kept = {"b": KeptFile(cache.path("b", "2-1", "x86_64"), "repository")}
    settle(host, cache.directory, ".rpm", kept, [], manifest, [("b", "2-1", "x86_64")], 0)
    assert sorted(p.name for p in (root / "var/lib/gpuguard/rpms").glob("*.rpm")) == ["b-2-1.x86_64.rpm"]


def _hold(argv: List[str]) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", *argv], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_waits_for_the_rpm_lock_and_gives_up_after_the_timeout(tmp_path: Path) -> None:
    """An fcntl lock on .rpm.lock (rpm's own kind) keeps the rollback waiting until the limit."""
    root, host, tool, _ = _rpm_root(tmp_path)
    lock = root / "var/lib/rpm/.rpm.lock"
    lock.write_text("")
    holder = _hold(["import fcntl,os,sys,time; fd=os.open(sys.argv[1], os.O_RDWR); fcntl.lockf(fd, fcntl.LOCK_EX); "
                    "print('held', flush=True); time.sleep(120)", str(lock)])
    try:
        started = time.monotonic()
        with pytest.raises(CommandTimeout, match=r"\.rpm\.lock"):
            tool.wait_for_rpm_lock()
        assert 0.9 < time.monotonic() - started < 60  # its timeout, not the holder's 120 s: load-proof
    finally:
        holder.kill()
        holder.wait()
    slept: List[float] = []
    tool.sleep = slept.append  # the lock is free at the first look: no poll, however slow the machine
    tool.wait_for_rpm_lock()
    assert slept == []


def test_waits_while_a_live_dnf_holds_its_pid_lock_but_not_for_a_dead_one(tmp_path: Path) -> None:
    """dnf4's rpmdb_lock.pid counts only while the process it names is alive."""
    root, host, tool, _ = _rpm_root(tmp_path)
    pid_file = root / "var/lib/dnf/rpmdb_lock.pid"
    pid_file.parent.mkdir(parents=True)
    holder = _hold(["print('held', flush=True); import time; time.sleep(30)"])
    try:
        pid_file.write_text(str(holder.pid))
        with pytest.raises(CommandTimeout, match="rpmdb_lock.pid"):
            tool.wait_for_rpm_lock()
    finally:
        holder.kill()
        holder.wait()
    assert not os.path.exists(f"/proc/{holder.pid}")
    assert tool.wait_for_rpm_lock() < 1  # the file still names the (now dead) holder


def test_a_dnf_killed_without_output_is_named_in_the_plan_error(tmp_path: Path) -> None:
    """dnf dying from a signal (SIGPIPE from a plugin's checker) gives a reason, not an empty line."""
    _, host, tool, runner = _rpm_root(tmp_path)
    runner.add(tool.argv("--assumeno", "shell", str(host.path(tool.script_path))), returncode=-13)
    assert tool.simulate(["install x-1-1.noarch"]) == ([], "dnf could not plan the rollback (killed by signal 13): "
                                                           "no output")


# What dnf5 5.4.6 printed for a rollback of a forced driver (Debian sid, tests/guard/dnf/dnf5/): the table on
# stdout ("replacing" rows are continuations), the rest on stderr, exit 1 for --assumeno.
DNF5_ASSUMENO = """\
Package                  Arch   Version                    Repository        Size
Downgrading:
 amdgpu-dkms             noarch 1:6.8.5.60202-2041575.el9  @commandline   2.0   B
   replacing amdgpu-dkms noarch 1:6.10.5.60300-2084815.el9 <unknown>      2.0   B
Removing:
 kernel-core             x86_64 5.14.0-570.el9             @System        2.0   B

Transaction Summary:
 Replacing:          1 package
 Downgrading:        1 package
 Removing:           1 package

"""
DNF5_STDERR = "Updating and loading repositories:\nRepositories loaded.\nOperation aborted by the user.\n"
DNF5_TARGETS = ["install /var/lib/gpuguard/rpms/amdgpu-dkms-6.8.5.60202-2041575.el9.noarch.rpm",
                "remove kernel-core-5.14.0-570.el9.x86_64"]


def _dnf5_root(tmp_path: Path):
    """A fake rpm root whose /usr/bin/dnf is dnf5 (Fedora 41+), with a fresh DnfTool over it."""
    root, host, _, runner = _rpm_root(tmp_path)
    (root / "usr/bin").mkdir(parents=True)
    os.symlink("dnf5", root / "usr/bin/dnf")
    (root / "usr/bin/dnf5").write_text("#!/bin/sh\n")
    (root / "usr/bin/dnf5").chmod(0o755)
    return root, host, DnfTool(host, lock_timeout_seconds=1, options=["-c", "/etc/test-dnf.conf"]), runner


def test_dnf5_do_args_group_the_lines_by_action() -> None:
    """One ``dnf5 do`` item list: ``--action=`` only where the verb changes."""
    assert dnf5_do_args(["install /k/a.rpm", "install /k/b.rpm", "install c-1-1.x86_64", "remove d-2-1.noarch"]) == [
        "do", "--action=install", "/k/a.rpm", "/k/b.rpm", "c-1-1.x86_64", "--action=remove", "d-2-1.noarch"]


def test_a_dnf5_host_plans_and_applies_the_rollback_with_one_dnf5_do(tmp_path: Path) -> None:
    """dnf5 has no 'dnf shell': the same lines go into one ``dnf5 do``, planned with --assumeno, then run."""
    root, host, tool, runner = _dnf5_root(tmp_path)
    assert tool.is_dnf5() and tool.mechanism == "dnf5 do"
    do = ["do", "--action=install", DNF5_TARGETS[0].split()[1], "--action=remove", DNF5_TARGETS[1].split()[1]]
    runner.add(tool.argv("--assumeno", *do), stdout=DNF5_ASSUMENO, stderr=DNF5_STDERR, returncode=1)
    plan, error = tool.simulate(DNF5_TARGETS)
    assert error is None
    assert plan == [PlannedStep("downgrade", "amdgpu-dkms", "", "1:6.8.5.60202-2041575.el9"),
                    PlannedStep("remove", "kernel-core", "5.14.0-570.el9", "")]
    runner.add(tool.argv("-y", *do), stdout="Complete!\n")
    assert tool.apply(DNF5_TARGETS) is None
    assert [list(c[:2]) for c in runner.calls[-2:]] == [["dnf", f"--installroot={root}"]] * 2
    assert not host.path(tool.script_path).exists()  # no dnf shell script on dnf5


def test_a_dnf5_refusal_or_unresolvable_item_fails_the_plan(tmp_path: Path) -> None:
    """dnf5 fails the whole transaction on an item it cannot resolve; the actions plugin's refusal is named."""
    _, _, tool, runner = _dnf5_root(tmp_path)
    runner.add(tool.argv("--assumeno", "do", "--action=install", "x-9-1.noarch"), returncode=1,
               stderr="Failed to resolve the transaction:\nNo match for argument: x-9-1.noarch\n")
    assert tool.simulate(["install x-9-1.noarch"]) == ([], "dnf could not plan the rollback: Failed to resolve the "
                                                           "transaction:; No match for argument: x-9-1.noarch")
    runner.add(tool.argv("-y", "do", "--action=remove", "y-1-1.noarch"), returncode=1,
               stderr="gpuguard: REFUSED (amd.pairing): y 1-1 -> (removed)\n"
                      'File "/etc/dnf/libdnf5-plugins/actions.d/gpuguard.actions" on line 6: Exit code: 10\n')
    assert tool.apply(["remove y-1-1.noarch"]) == (
        "dnf5 do failed (exit 1): gpuguard: REFUSED (amd.pairing): y 1-1 -> (removed); "
        'File "/etc/dnf/libdnf5-plugins/actions.d/gpuguard.actions" on line 6: Exit code: 10')


def test_dnf5_is_found_when_there_is_no_dnf(tmp_path: Path) -> None:
    """A host with /usr/bin/dnf5 and no dnf (Debian sid) runs ``dnf5``; an explicit program is kept."""
    root, host, _, _ = _rpm_root(tmp_path)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/dnf5").write_text("#!/bin/sh\n")
    (root / "usr/bin/dnf5").chmod(0o755)
    tool = DnfTool(host)
    assert tool.argv("do")[0] == "dnf5" and tool.is_dnf5()
    assert not DnfTool(host, program="/opt/dnf4/bin/dnf").is_dnf5()
