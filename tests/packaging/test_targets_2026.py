"""The 2026 targets (debian13, ubuntu2604, el10, sles15, sles16) and the Python-version-independent layout: one
vendor tree per Python a target may run on, chosen by the launcher, so a release upgrade keeps the agent working."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest

from tests.packaging.conftest import REPO, need_tools, rpm, run
from tests.packaging.test_build import deb_field, deb_listing, rpm_query, unpack_rpm

pytestmark = pytest.mark.timeout(600)

Built = Callable[[str], Dict[str, Path]]
# target -> (ABIs vendored, Python dependencies, the guard's hook file, unit directory)
EXPECTED: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...], Optional[str], str]] = {
    "debian12": (("cp311", "cp313"), ("python3 (>= 3.11~)", "python3 (<< 3.14)"),
                 "/usr/lib/gpuguard/gpuguard-apt-hook", "/lib/systemd/system"),
    "debian13": (("cp313",), ("python3 (>= 3.13~)", "python3 (<< 3.14)"), "/usr/lib/gpuguard/gpuguard-apt-hook",
                 "/usr/lib/systemd/system"),
    "ubuntu2404": (("cp312", "cp314"), ("python3 (>= 3.12~)", "python3 (<< 3.15)"),
                   "/usr/lib/gpuguard/gpuguard-apt-hook", "/usr/lib/systemd/system"),
    "ubuntu2604": (("cp314",), ("python3 (>= 3.14~)", "python3 (<< 3.15)"), "/usr/lib/gpuguard/gpuguard-apt-hook",
                   "/usr/lib/systemd/system"),
    "el9": (("cp39", "cp312"), ("(python(abi) = 3.9 or python(abi) = 3.12)",),
            "/usr/lib/python3.12/site-packages/dnf-plugins/gpuguard.py", "/usr/lib/systemd/system"),
    "el10": (("cp312",), ("python(abi) = 3.12",), "/usr/lib/python3.12/site-packages/dnf-plugins/gpuguard.py",
             "/usr/lib/systemd/system"),
    "sles15": (("cp311",), ("python(abi) = 3.11", "python311"), None, "/usr/lib/systemd/system"),
    "sles16": (("cp313",), ("python(abi) = 3.13",), None, "/usr/lib/systemd/system"),
}


# What the sles packages install for the zypper guard (packaging/zypper/README.md).
ZYPPER_GUARD = ("/usr/lib64/rpm-plugins/gpuguard.so", "/usr/lib/rpm/macros.d/macros.transaction_gpuguard",
                "/usr/lib/gpuguard/gpuguard-zypper-hook", "/usr/lib/zypp/plugins/commit/gpuguard")
# The librpm functions the plugin calls: each was checked against rpm 4.14.3's and 4.20.0's headers (same
# prototype; packaging/zypper/README.md). A new call fails test_the_sles_rpm_plugin_... until it is checked too.
CHECKED_RPM_API = frozenset({
    "rpmExpand", "rpmtsRootDir", "rpmtsInitIterator", "rpmdbNextIterator", "rpmdbFreeIterator", "headerIsEntry",
    "headerGetNumber", "headerGetString", "rpmtsiInit", "rpmtsiNext", "rpmtsiFree", "rpmteType", "rpmteN", "rpmteE",
    "rpmteV", "rpmteR", "rpmteA"})
# The oldest glibc the plugin may need: RHEL 8's 2.28, the oldest among the targets (SLES 15 SP7 has 2.31).
MAX_GLIBC = (2, 28)


def listing(package: Path) -> List[str]:
    return sorted(deb_listing(package)) if package.suffix == ".deb" else rpm_query(package, "-l")


def python_depends(package: Path) -> List[str]:
    if package.suffix == ".deb":
        return [d for d in deb_field(package, "Depends").split(", ") if d.startswith("python3")]
    return [r for r in rpm_query(package, "--requires") if "python" in r]


@pytest.mark.parametrize("target", sorted(EXPECTED))
def test_each_target_builds_with_its_pythons_hook_and_unit(target: str, built: Built) -> None:
    """build.sh --target T: a vendor tree with compiled wheels per Python, those Pythons as dependencies, the
    front end's guard file, the unit, and no other front end's files."""
    abis, depends, hook, unit_dir = EXPECTED[target]
    packages = built(target)
    agent = packages["gpuguard"]
    files = listing(agent)
    for abi in abis:
        tag = f"cpython-{abi[2:]}-x86_64-linux-gnu"
        assert any(re.fullmatch(rf"/usr/lib/gpuguard/vendor/{abi}/pydantic_core/.*{tag}\.so", p) for p in files), abi
        assert f"/usr/lib/gpuguard/vendor/{abi}/structlog/__init__.py" in files, abi
    assert {p.split("/")[5] for p in files if p.startswith("/usr/lib/gpuguard/vendor/") and p.count("/") > 5} \
        == set(abis)
    assert sorted(python_depends(agent)) == sorted(depends)
    assert f"{unit_dir}/gpuguard.service" in files and "/usr/bin/gpuguard" in files
    if hook:
        assert hook in files
    others = [p for p in files if "apt.conf.d" in p or "dnf-plugins" in p or "libdnf5" in p]
    if target.startswith("sles"):
        assert others == [], others
        assert set(ZYPPER_GUARD) <= set(files), sorted(set(ZYPPER_GUARD) - set(files))
        assert not [p for p in files if p.endswith(".c")]  # the plugin ships built, not as source
    hub_files = listing(packages["gpuguard-hub"])
    for abi in abis:
        assert f"/usr/lib/gpuguard/vendor-hub/{abi}/fastapi/__init__.py" in hub_files, abi


@pytest.mark.parametrize("target,interpreter", [("sles15", "/usr/bin/python3.11"), ("sles16", "/usr/bin/python3"),
                                                ("el10", "/usr/bin/python3"), ("debian13", "/usr/bin/python3")])
def test_launchers_name_the_target_interpreter(target: str, interpreter: str, built: Built, tmp_path: Path) -> None:
    """SLES 15 runs the agent on the python311 module's interpreter; the others on the system python3."""
    package = built(target)["gpuguard"]
    if package.suffix == ".deb":
        run(["dpkg-deb", "-x", str(package), str(tmp_path)])
    else:
        need_tools("rpm2cpio", "cpio")
        unpack_rpm(package, tmp_path)
    assert (tmp_path / "usr/bin/gpuguard").read_text().startswith(f"#!{interpreter} -IS\n")


def interpreter(version: str) -> Path:
    found = sorted((Path.home() / ".pyenv/versions").glob(f"{version}.*/bin/python{version}"))
    if sys.version_info[:2] == tuple(int(x) for x in version.split(".")):
        return Path(sys.executable)
    if not found:
        pytest.skip(f"no Python {version} interpreter on this machine (optional cross-check)")
    return found[-1]


def unpacked_launcher(package: Path, root: Path) -> Path:
    """The package's /usr/bin/gpuguard unpacked under ``root``, pointed at the unpacked /usr/lib/gpuguard."""
    run(["dpkg-deb", "-x", str(package), str(root)])
    launcher = root / "usr/bin/gpuguard"
    text = launcher.read_text().replace('GPUGUARD_LIB = "/usr/lib/gpuguard"',
                                        f'GPUGUARD_LIB = "{root / "usr/lib/gpuguard"}"')
    launcher.write_text(text)
    return launcher


@pytest.mark.parametrize("version", ["3.11", "3.13"])
def test_the_debian12_package_runs_on_both_sides_of_the_release_upgrade(version: str, built: Built,
                                                                         tmp_path: Path) -> None:
    """The debian12 .deb's own launcher checks a policy on Python 3.11 (bookworm) and on 3.13 (trixie)."""
    python = interpreter(version)
    launcher = unpacked_launcher(built("debian12")["gpuguard"], tmp_path)
    result = run([str(python), "-IS", str(launcher), "policy", "check", str(REPO / "policies/example.toml"),
                  "--matrix", str(tmp_path / "usr/share/gpuguard/amd-compat-matrix.toml")], check=False)
    assert result.returncode == 0, result.stderr
    assert ": ok: policy 'mi300x-rocm-6.2'" in result.stdout


def test_a_python_without_vendored_wheels_is_one_clear_line(built: Built, tmp_path: Path) -> None:
    """The debian13 package started by Python 3.11: exit 70 and one line naming the Python and the fix."""
    if sys.version_info[:2] == (3, 13):
        pytest.skip("this interpreter is the one the package is built for")
    launcher = unpacked_launcher(built("debian13")["gpuguard"], tmp_path)
    result = run([sys.executable, "-IS", str(launcher), "--version"], check=False)
    assert result.returncode == 70
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"no libraries for Python {sys.version_info[0]}.{sys.version_info[1]}" in result.stderr
    assert "it has cp313" in result.stderr


@pytest.mark.parametrize("target", ["el10", "sles15", "sles16"])
def test_rpmlint_reports_nothing_unexplained_for_the_new_rpm_targets(target: str, built: Built) -> None:
    """rpmlint with packaging/rpm/gpuguard.rpmlintrc on el10 and the SLES packages: 0 errors, 0 warnings."""
    need_tools("rpmlint")
    packages = built(target)
    result = run(["rpmlint", "--ignore-unused-rpmlintrc", "-r", str(REPO / "packaging/rpm/gpuguard.rpmlintrc"),
                  str(packages["gpuguard"]),
                  str(packages["gpuguard-hub"])], check=False, timeout_seconds=280)
    assert "0 errors, 0 warnings" in result.stdout, result.stdout
    assert result.returncode == 0


@pytest.mark.parametrize("target", ["sles15", "sles16"])
def test_sles_packages_query_as_suse_packages(target: str, built: Built) -> None:
    """rpm -qp: the SLES release tag, the unit, the scriptlets that enable the unit and compile the policy."""
    agent = built(target)["gpuguard"]
    assert rpm_query(agent, "--qf", "%{RELEASE}") == [f"1.{target}"]
    scripts = "\n".join(rpm_query(agent, "--scripts"))
    for needle in ("gpuguard policy compile", "systemctl --no-reload enable gpuguard.service", "compileall"):
        assert needle in scripts, needle
    assert "/usr/lib/systemd/system/gpuguard.service" in rpm_query(agent, "-l")


@pytest.mark.timeout(300)
def test_el10_rpm_installs_and_erases_in_an_rpm_root(rpm_root: Path, built: Built) -> None:
    """The el10 packages install into an rpm root (scriptlets run, warn, exit 0), verify clean and erase."""
    packages = built("el10")
    result = rpm(rpm_root, "-i", "--nodeps", str(packages["gpuguard"]), str(packages["gpuguard-hub"]))
    assert "no policy in /etc/gpuguard/policy.d yet" in result.stderr
    assert (rpm_root / "usr/lib/python3.12/site-packages/dnf-plugins/gpuguard.py").is_file()
    assert (rpm_root / "usr/lib/gpuguard/vendor/cp312/pydantic/__init__.py").is_file()
    assert rpm(rpm_root, "-V", "--nodeps", "gpuguard", "gpuguard-hub", check=False).stdout == ""
    rpm(rpm_root, "-e", "gpuguard-hub", "gpuguard")
    assert rpm(rpm_root, "-qa").stdout.strip() == ""
    assert not (rpm_root / "usr/lib/gpuguard").exists()


@pytest.mark.timeout(300)
def test_lintian_reports_nothing_unexplained_for_debian13(built: Built) -> None:
    """lintian on the debian13 packages: no error or warning beyond the shipped overrides."""
    need_tools("lintian")
    packages = built("debian13")
    result = run(["lintian", "--tag-display-limit", "0", str(packages["gpuguard"]), str(packages["gpuguard-hub"])],
                 check=False, timeout_seconds=280)
    findings = [line for line in result.stdout.splitlines() if line[:2] in ("E:", "W:")]
    assert findings == [], "\n".join(findings)


def readelf(*args: str) -> str:
    return run(["readelf", "-W", *args]).stdout


@pytest.mark.parametrize("target", ["sles15", "sles16"])
def test_the_sles_rpm_plugin_is_built_to_load_in_any_rpm_from_4_14_to_4_20(target: str, built: Built,
                                                                          tmp_path: Path) -> None:
    """gpuguard.so in the sles .rpm: x86_64, no DT_NEEDED on librpm, gpuguard_hooks exported, only checked librpm
    calls left undefined, and no glibc symbol newer than 2.28."""
    need_tools("rpm2cpio", "cpio", "readelf")
    package = built(target)["gpuguard"]
    assert rpm_query(package, "--qf", "%{ARCH}") == ["x86_64"]
    unpack_rpm(package, tmp_path)
    plugin = str(tmp_path / ZYPPER_GUARD[0].lstrip("/"))
    assert "ELF64" in readelf("-h", plugin) and "X86-64" in readelf("-h", plugin)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", readelf("-d", plugin))
    assert needed == ["libc.so.6"], needed
    symbols = [line.split() for line in readelf("--dyn-syms", plugin).splitlines() if re.match(r"\s*\d+:", line)]
    defined = {row[7] for row in symbols if len(row) >= 8 and row[6] != "UND" and row[4] == "GLOBAL"}
    assert defined == {"gpuguard_hooks"}, defined
    undefined = {row[7] for row in symbols if len(row) >= 8 and row[6] == "UND"}
    from_rpm = {name for name in undefined if "@" not in name and not name.startswith(("_ITM_", "__gmon_start__"))}
    assert from_rpm == CHECKED_RPM_API, from_rpm ^ CHECKED_RPM_API
    glibc = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_([0-9.]+)", readelf("-V", plugin))}
    assert glibc and max(glibc) <= MAX_GLIBC, sorted(glibc)


def test_sles15_and_sles16_ship_the_same_rpm_plugin(built: Built, tmp_path: Path) -> None:
    """One build of gpuguard.so serves both SLES releases: the two packages carry byte-identical plugins."""
    need_tools("rpm2cpio", "cpio")
    plugins = []
    for target in ("sles15", "sles16"):
        (tmp_path / target).mkdir()
        unpack_rpm(built(target)["gpuguard"], tmp_path / target)
        plugins.append((tmp_path / target / ZYPPER_GUARD[0].lstrip("/")).read_bytes())
    assert plugins[0] == plugins[1]


@pytest.mark.parametrize("gcc_wrapper,needle", [
    (None, "gcc is not installed"),
    ("#!/bin/sh\nexec /usr/bin/gcc -nostdinc \"$@\"\n", "librpm's headers (rpm/rpmts.h) are not installed"),
])
def test_a_sles_build_without_gcc_or_rpm_headers_is_one_clear_line(gcc_wrapper: Optional[str], needle: str,
                                                                   tmp_path: Path) -> None:
    """build.py --target sles15 with no gcc on PATH, or a gcc that finds no rpm headers: exit 1, one line naming
    the packages to install, before any download."""
    need_tools("gcc")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if gcc_wrapper is not None:
        (bin_dir / "gcc").write_text(gcc_wrapper)
        (bin_dir / "gcc").chmod(0o755)
    result = run([sys.executable, str(REPO / "packaging/build.py"), "--target", "sles15", "--offline", "--no-hub",
                  "--wheelhouse", str(tmp_path / "empty"), "--out", str(tmp_path / "out")], check=False,
                 env={"PATH": str(bin_dir)})
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert needle in result.stderr and "apt-get install gcc librpm-dev" in result.stderr
    assert not (tmp_path / "out").exists()
