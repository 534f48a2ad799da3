"""What packaging/build.sh puts into each package: the layout contract (notes/layout.md), conffiles, interpreters."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from tests.packaging.conftest import REPO, UPGRADE_VERSION, WHEELHOUSE, build, by_name, need_tools, run

DNF_FILES = {  # repo file -> installed path on RHEL 9 (present once the dnf guard ships them)
    "packaging/dnf/gpuguard-dnf-check": "/usr/lib/gpuguard/gpuguard-dnf-check",
    "packaging/dnf/gpuguard.py": "/usr/lib/python3.9/site-packages/dnf-plugins/gpuguard.py",
    "packaging/dnf/gpuguard.conf": "/etc/dnf/plugins/gpuguard.conf",
    "packaging/dnf5/gpuguard-dnf5-action": "/usr/lib/gpuguard/gpuguard-dnf5-action",
    "packaging/dnf5/gpuguard.actions": "/etc/dnf/libdnf5-plugins/actions.d/gpuguard.actions",
}
CONFIG_FILES = {"/etc/gpuguard/agent.toml", "/etc/gpuguard/example-policy.toml"}
# A cold first build downloads wheels (tens of seconds per target Python): more than the default 120 s budget.
pytestmark = pytest.mark.timeout(600)


def deb_listing(deb: Path) -> Dict[str, str]:
    """{installed path: mode string} of a .deb's data."""
    out = {}
    for line in run(["dpkg-deb", "-c", str(deb)]).stdout.splitlines():
        parts = line.split(None, 5)
        out["/" + parts[5].split(" -> ")[0].lstrip("./").rstrip("/")] = parts[0]
    return out


def deb_field(deb: Path, name: str) -> str:
    return run(["dpkg-deb", "-f", str(deb), name]).stdout.strip()


def deb_file(deb: Path, path: str, tmp_path: Path) -> str:
    target = tmp_path / "x"
    if not target.exists():
        run(["dpkg-deb", "-x", str(deb), str(target)])
    return (target / path.lstrip("/")).read_text()


def rpm_query(rpm: Path, *args: str) -> List[str]:
    return run(["rpm", "-qp", *args, str(rpm)]).stdout.splitlines()


def unpack_rpm(rpm: Path, dest: Path) -> None:
    """``rpm2cpio RPM | cpio -idm`` in dest, without a shell."""
    rpm2cpio = subprocess.Popen(["rpm2cpio", str(rpm)], stdout=subprocess.PIPE)
    assert rpm2cpio.stdout is not None
    try:
        subprocess.run(["cpio", "-idm", "--quiet"], stdin=rpm2cpio.stdout, cwd=dest, check=True)
    finally:
        rpm2cpio.stdout.close()
        assert rpm2cpio.wait() == 0, f"rpm2cpio {rpm} failed"


def test_deb_holds_the_layout_with_conffiles_and_private_state(debian12: Dict[str, Path], tmp_path: Path) -> None:
    """The Debian 12 .deb installs the command, agent, vendored deps, unit, apt hook, configs, knowledge tables and a
    0750 state dir."""
    deb = debian12["gpuguard"]
    files = deb_listing(deb)
    for path in ("/usr/bin/gpuguard", "/usr/lib/gpuguard/agent/cli.py", "/usr/lib/gpuguard/agent/guard/apt/hook.py",
                 "/usr/lib/gpuguard/gpuguard-apt-hook", "/etc/apt/apt.conf.d/50gpuguard",
                 "/lib/systemd/system/gpuguard.service", "/usr/share/gpuguard/amd-compat-matrix.toml",
                 "/usr/share/gpuguard/knowledge/dcgm-exporter.toml",
                 "/usr/share/man/man1/gpuguard.1.gz", "/usr/share/doc/gpuguard/copyright", *CONFIG_FILES):
        assert path in files, path
    assert files["/var/lib/gpuguard"] == "drwxr-x---"
    assert files["/etc/gpuguard/policy.d"].startswith("d")
    assert any(re.match(r"/usr/lib/gpuguard/vendor/cp311/pydantic_core/.*cpython-311-x86_64-linux-gnu\.so$", p)
               for p in files)
    assert not any("__pycache__" in p or p.endswith(".pyc") for p in files)
    assert not any(re.match(r"/usr/lib/gpuguard/vendor/cp3[0-9]+/bin", p) for p in files)
    conffiles = set(run(["dpkg-deb", "-I", str(deb), "conffiles"]).stdout.split())
    assert conffiles == CONFIG_FILES | {"/etc/apt/apt.conf.d/50gpuguard"}
    depends = deb_field(deb, "Depends")
    assert "python3 (>= 3.11~)" in depends and "python3 (<< 3.14)" in depends  # bookworm's and trixie's
    assert "procps" in depends.split(", ")  # /bin/kill: the unit's ExecReload (a minbase host lacks it)
    assert deb_file(deb, "/usr/bin/gpuguard", tmp_path).startswith("#!/usr/bin/python3 -IS\n")
    assert deb_file(deb, "/usr/lib/gpuguard/gpuguard-apt-hook", tmp_path).startswith("#!/usr/bin/python3 -IS\n")
    assert '__version__ = "0.1.0"' in deb_file(deb, "/usr/lib/gpuguard/agent/__init__.py", tmp_path)


def test_hub_deb_vendors_only_what_the_agent_lacks(debian12: Dict[str, Path]) -> None:
    """gpuguard-hub depends on the same gpuguard build and adds FastAPI/uvicorn/psycopg, not a second pydantic."""
    hub = debian12["gpuguard-hub"]
    files = deb_listing(hub)
    assert "/usr/lib/gpuguard/vendor-hub/cp311/fastapi/__init__.py" in files
    assert "/usr/lib/gpuguard/vendor-hub/cp311/uvicorn/__init__.py" in files
    assert "/usr/lib/gpuguard/vendor-hub/cp311/psycopg/__init__.py" in files
    assert not any(re.match(r"/usr/lib/gpuguard/vendor-hub/cp3[0-9]+/pydantic", p) for p in files)
    assert "/lib/systemd/system/gpuguard-hub.service" in files
    assert deb_field(hub, "Depends").startswith(f"gpuguard (= {deb_field(debian12['gpuguard'], 'Version')})")


def test_rpm_holds_the_layout_dnf_files_and_config(el9: Dict[str, Path]) -> None:
    """The RHEL 9 .rpm carries the agent for Python 3.9 (with tomli), the unit, configs, and the dnf guard's files."""
    rpm = el9["gpuguard"]
    files = set(rpm_query(rpm, "-l"))
    for path in ("/usr/bin/gpuguard", "/usr/lib/gpuguard/agent/cli.py", "/usr/lib/systemd/system/gpuguard.service",
                 "/var/lib/gpuguard", "/etc/gpuguard/policy.d", "/usr/lib/gpuguard/vendor/cp39/tomli/__init__.py",
                 "/usr/share/gpuguard/knowledge/dcgm-exporter.toml", *CONFIG_FILES):
        assert path in files, path
    assert any(re.search(r"/vendor/cp39/pydantic_core/.*cpython-39-x86_64-linux-gnu\.so$", p) for p in files)
    assert "/etc/apt/apt.conf.d/50gpuguard" not in files and "/usr/lib/gpuguard/gpuguard-apt-hook" not in files
    for source, installed in DNF_FILES.items():
        if (REPO / source).is_file():
            assert installed in files, installed
    configs = set(rpm_query(rpm, "-c"))
    expected = CONFIG_FILES | {p for s, p in DNF_FILES.items() if p.startswith("/etc/") and (REPO / s).is_file()}
    assert configs == expected
    assert "(python(abi) = 3.9 or python(abi) = 3.12)" in rpm_query(rpm, "--requires")
    modes = dict(line.split(" ", 1)[::-1] for line in rpm_query(rpm, "--qf", "[%{FILEMODES:perms} %{FILENAMES}\n]"))
    assert modes["/var/lib/gpuguard"] == "drwxr-x---"
    assert modes["/usr/bin/gpuguard"] == "-rwxr-xr-x"
    scripts = "\n".join(rpm_query(rpm, "--scripts"))
    for needle in ("compileall", "gpuguard policy compile", "systemctl enable gpuguard.service",
                   "[ -d /run/systemd/system ]", "systemctl try-restart gpuguard.service"):
        assert needle in scripts, needle


def test_el8_launchers_use_python311_and_the_plugin_goes_to_platform_python(dist: Path, tmp_path: Path) -> None:
    """RHEL 8: the agent runs on /usr/bin/python3.11; the dnf plugin lands in dnf's own Python 3.6 tree."""
    need_tools("rpmbuild", "rpm", "rpm2cpio", "cpio")
    rpm = by_name(build("el8", dist / "el8", "--no-hub"))["gpuguard"]
    assert "python(abi) = 3.11" in rpm_query(rpm, "--requires")
    files = set(rpm_query(rpm, "-l"))
    if (REPO / "packaging/dnf/gpuguard.py").is_file():
        assert "/usr/lib/python3.6/site-packages/dnf-plugins/gpuguard.py" in files
    unpack_rpm(rpm, tmp_path)
    launchers = [tmp_path / "usr/bin/gpuguard", *(tmp_path / "usr/lib/gpuguard").glob("gpuguard-*")]
    if (REPO / "packaging/dnf/gpuguard-dnf-check").is_file():
        assert tmp_path / "usr/lib/gpuguard/gpuguard-dnf-check" in launchers, launchers
    for launcher in launchers:
        assert launcher.read_text().startswith("#!/usr/bin/python3.11 -IS\n"), launcher


def test_ubuntu2404_build_targets_python312(ubuntu2404: Path) -> None:
    """The same command builds for Ubuntu 24.04: Python 3.12 wheels, python3 3.12 dependency, unit in /usr/lib."""
    deb = ubuntu2404
    assert deb.name == "gpuguard_0.1.0-1~ubuntu24.04_amd64.deb"
    files = deb_listing(deb)
    assert any(re.search(r"/vendor/cp312/pydantic_core/.*cpython-312-x86_64-linux-gnu\.so$", p) for p in files)
    assert "/usr/lib/systemd/system/gpuguard.service" in files
    assert "python3 (>= 3.12~)" in deb_field(deb, "Depends")


def test_upgrade_build_is_newer(debian12: Dict[str, Path], debian12_upgrade: Path) -> None:
    """--version gives a package dpkg orders after the default build."""
    old, new = deb_field(debian12["gpuguard"], "Version"), deb_field(debian12_upgrade, "Version")
    assert new.startswith(UPGRADE_VERSION)
    assert run(["dpkg", "--compare-versions", new, "gt", old], check=False).returncode == 0


@pytest.mark.parametrize("python_version", ["3.9", "3.12"])
def test_vendored_tree_runs_on_the_target_python(python_version: str, tmp_path: Path,
                                                 request: pytest.FixtureRequest) -> None:
    """Where this machine has the target's interpreter, the staged agent imports and checks a policy with it."""
    interpreter = Path.home() / ".pyenv/versions"
    found = sorted(interpreter.glob(f"{python_version}.*/bin/python{python_version}"))
    if not found:
        pytest.skip(f"no Python {python_version} interpreter on this machine (optional cross-check)")
    if python_version == "3.9":
        need_tools("rpm2cpio", "cpio")
        pkg = request.getfixturevalue("el9")["gpuguard"]
    else:
        pkg = request.getfixturevalue("ubuntu2404")
    root = tmp_path / "root"
    root.mkdir()
    if pkg.suffix == ".deb":
        run(["dpkg-deb", "-x", str(pkg), str(root)])
    else:
        unpack_rpm(pkg, root)
    lib = root / "usr/lib/gpuguard"
    vendor = lib / "vendor" / ("cp" + python_version.replace(".", ""))
    code = (f"import sys; sys.path[:0] = [{str(lib)!r}, {str(vendor)!r}]; from agent.cli import main; "
            f"sys.exit(main(sys.argv[1:]))")
    result = run([str(found[-1]), "-IS", "-c", code, "policy", "check", str(REPO / "policies/example.toml"),
                  "--matrix", str(root / "usr/share/gpuguard/amd-compat-matrix.toml")], check=False)
    assert result.returncode == 0, result.stderr
    assert ": ok: policy 'mi300x-rocm-6.2'" in result.stdout


def test_offline_build_without_wheels_is_one_clear_line(tmp_path: Path) -> None:
    """--offline with an empty wheelhouse fails with one line naming the fix, not a traceback."""
    result = run([sys.executable, str(REPO / "packaging/build.py"), "--target", "debian12", "--offline",
                  "--wheelhouse", str(tmp_path / "empty"), "--out", str(tmp_path / "out")], check=False)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "run once without --offline" in result.stderr
    assert "Traceback" not in result.stderr


def test_wheelhouse_is_cached_outside_the_build(debian12: Dict[str, Path]) -> None:
    """A build leaves its wheel set in the shared cache, marked complete."""
    assert WHEELHOUSE.is_dir()
    sets = [d for d in WHEELHOUSE.iterdir() if d.is_dir() and (d / "COMPLETE").is_file()]
    assert sets and all(list(d.glob("*.whl")) for d in sets)
