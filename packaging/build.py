"""Build gpuguard's .deb / .rpm for one target distribution: ``packaging/build.sh --target T [--version V]``.

Steps (packaging/README.md has the table of targets and why dpkg-deb/rpmbuild):

1. wheelhouse  ``pip download`` the runtime dependencies (pyproject.toml) as wheels for the target's Python
               ABI and glibc, once, into ``--wheelhouse`` (keyed by a hash of what was asked); the only step that
               needs the network. ``--offline`` refuses to download.
2. stage       the installed tree: the agent under /usr/lib/gpuguard/agent, the wheels installed (--no-deps, from
               the wheelhouse only) into /usr/lib/gpuguard/vendor, launchers with the target's interpreter, units,
               hook configs, example config and policy, docs, man page.
3. package     dpkg-deb (conffiles, maintainer scripts) or rpmbuild (a spec whose %install copies the stage).

Only the standard library is used here; pip runs as a subprocess (``packaging/pip_for_target.py``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
PACKAGING = REPO / "packaging"
LIB = "/usr/lib/gpuguard"
MAINTAINER = "gpuguard maintainers <maintainers@gpuguard.invalid>"
HOMEPAGE = "https://gpuguard.invalid/"
SUMMARY = "GPU host agent: freezes and guards the kernel, driver and ROCm/CUDA stack"
DESCRIPTION = """\
gpuguard snapshots a GPU host's kernel, AMD/NVIDIA driver, ROCm/CUDA and
container stack, runs a quick accelerator health check, refuses apt/dnf
transactions that break the host's driver/ROCm pairing policy (and rolls back
those that bypassed the package manager), and reports drift to a central
endpoint.

Its Python dependencies are vendored under /usr/lib/gpuguard/vendor, built for
this distribution's Python, so the host's Python packages never conflict."""
HUB_SUMMARY = "Central endpoint receiving the reports of gpuguard agents (gpuguard hub)"
HUB_DESCRIPTION = """\
The reference central endpoint for gpuguard agents (gpuguard hub serve): it
checks host tokens, stores report events (SQLite or PostgreSQL) and answers
fleet questions. Vendors FastAPI, uvicorn and psycopg under
/usr/lib/gpuguard/vendor-hub."""
# Every manylinux tag up to the oldest target's glibc (RHEL 8: 2.28): pip does not expand a --platform itself.
PLATFORMS = tuple([f"manylinux_2_{minor}_x86_64" for minor in range(28, 4, -1)]
                  + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"])
WHEELHOUSE_FORMAT = 1  # bump when the download arguments change


@dataclass(frozen=True)
class Target:
    """One distribution release the packages are built for.

    ``python_versions``: every Python the vendored wheels are built for, the release's own first, then the one its
    supported release upgrade moves the system Python to (Debian 12 -> 13: 3.11 and 3.13). Each gets a whole
    vendor tree under ``vendor/cpXY``; the launcher picks the running interpreter's, so the package keeps working
    when a release upgrade replaces python3 under it (docs/packaging.md, "Surviving the release upgrade").
    """

    name: str
    fmt: str                     # "deb" or "rpm"
    manager: str                 # the package manager the guard hooks into: apt, dnf or zypper
    distro: str                  # human-readable
    python: str                  # the agent's interpreter on the target
    python_versions: Tuple[str, ...]
    version_suffix: str          # deb: "~deb12" appended to the revision; rpm: ".el9" dist tag
    unit_dir: str
    depends: Tuple[str, ...]     # deb Depends / rpm Requires besides the Python ones
    dnf_python_versions: Tuple[str, ...] = ()   # the Pythons dnf itself runs on (rpm): where the plugin goes

    @property
    def python_version(self) -> str:
        """The release's own Python: the oldest the package supports."""
        return self.python_versions[0]

    @property
    def dnf_plugin_dirs(self) -> Tuple[str, ...]:
        return tuple(f"/usr/lib/python{v}/site-packages/dnf-plugins" for v in self.dnf_python_versions)

    def python_depends(self) -> Tuple[str, ...]:
        """The package's dependency on an interpreter it has wheels for (deb: a version range of python3; rpm: one
        of the python(abi) versions, or the named interpreter's package)."""
        if self.fmt == "deb":
            low, high = self.python_versions[0], self.python_versions[-1]
            major, minor = high.split(".")
            return (f"python3 (>= {low}~)", f"python3 (<< {major}.{int(minor) + 1})")
        abis = [f"python(abi) = {v}" for v in self.python_versions]
        return (abis[0],) if len(abis) == 1 else ("(" + " or ".join(abis) + ")",)


def abi(python_version: str) -> str:
    return "cp" + python_version.replace(".", "")


# libc6: the vendored extension modules are manylinux wheels up to glibc 2.28 (PLATFORMS). procps: /bin/kill, the
# unit's ExecReload (`systemctl reload gpuguard` fails with 203/EXEC on a host without it, e.g. a minbase).
DEB_DEPENDS = ("libc6 (>= 2.28)", "procps")
SYSTEMD_LIB = "/usr/lib/systemd/system"
TARGETS: Dict[str, Target] = {t.name: t for t in (
    Target("debian12", "deb", "apt", "Debian 12 (bookworm)", "/usr/bin/python3", ("3.11", "3.13"), "~deb12",
           "/lib/systemd/system", DEB_DEPENDS),
    Target("debian13", "deb", "apt", "Debian 13 (trixie)", "/usr/bin/python3", ("3.13",), "~deb13", SYSTEMD_LIB,
           DEB_DEPENDS),
    Target("ubuntu2204", "deb", "apt", "Ubuntu 22.04 (jammy)", "/usr/bin/python3", ("3.10", "3.12"), "~ubuntu22.04",
           "/lib/systemd/system", DEB_DEPENDS),
    Target("ubuntu2404", "deb", "apt", "Ubuntu 24.04 (noble)", "/usr/bin/python3", ("3.12", "3.14"), "~ubuntu24.04",
           SYSTEMD_LIB, DEB_DEPENDS),
    Target("ubuntu2604", "deb", "apt", "Ubuntu 26.04 (resolute)", "/usr/bin/python3", ("3.14",), "~ubuntu26.04",
           SYSTEMD_LIB, DEB_DEPENDS),
    Target("el8", "rpm", "dnf", "RHEL 8 / Rocky 8 / Alma 8 (python3.11 module stream)", "/usr/bin/python3.11",
           ("3.11",), ".el8", SYSTEMD_LIB, ("python3.11",), dnf_python_versions=("3.6",)),
    # EL9 -> EL10 (leapp) moves dnf and python3 from 3.9 to 3.12: the plugin goes to both of dnf's trees.
    Target("el9", "rpm", "dnf", "RHEL 9 / Rocky 9 / Alma 9", "/usr/bin/python3", ("3.9", "3.12"), ".el9",
           SYSTEMD_LIB, (), dnf_python_versions=("3.9", "3.12")),
    Target("el10", "rpm", "dnf", "RHEL 10 / Rocky 10 / Alma 10 (dnf 4.20)", "/usr/bin/python3", ("3.12",), ".el10",
           SYSTEMD_LIB, (), dnf_python_versions=("3.12",)),
    # SLES 15 SP7: the system python3 is 3.6; the agent runs on the python311 module's interpreter.
    Target("sles15", "rpm", "zypper", "SUSE Linux Enterprise Server 15 SP7 (python311 module)", "/usr/bin/python3.11",
           ("3.11",), ".sles15", SYSTEMD_LIB, ("python311",)),
    # SLES 16.0: its system Python is taken as 3.13 (not verified on a SLES 16 host; docs/packaging.md).
    Target("sles16", "rpm", "zypper", "SUSE Linux Enterprise Server 16", "/usr/bin/python3", ("3.13",), ".sles16",
           SYSTEMD_LIB, ()),
)}


class BuildError(Exception):
    """A build step failed; the message says which and why (one line)."""


@dataclass
class Entry:
    """One path of the staged tree and how the package treats it."""

    path: str                    # absolute installed path
    kind: str = "file"           # file | dir
    mode: int = 0o644
    config: bool = False         # conffile (deb) / %config(noreplace) (rpm)
    doc: bool = False


@dataclass
class Stage:
    root: Path
    entries: List[Entry] = field(default_factory=list)

    def add_file(self, source: Path, path: str, mode: int = 0o644, config: bool = False, text: Optional[str] = None,
                 data: Optional[bytes] = None) -> None:
        dest = self.root / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if text is not None:
            dest.write_text(text, encoding="utf-8")
        elif data is not None:
            dest.write_bytes(data)
        else:
            shutil.copyfile(source, dest)
        dest.chmod(mode)
        self.entries.append(Entry(path, "file", mode, config, doc=path.startswith("/usr/share/doc/")))

    def add_dir(self, path: str, mode: int = 0o755) -> None:
        dest = self.root / path.lstrip("/")
        dest.mkdir(parents=True, exist_ok=True)
        dest.chmod(mode)
        self.entries.append(Entry(path, "dir", mode))

    def add_tree(self, path: str) -> None:
        """Record everything already copied under ``path``: dirs 0755, files 0644 (python runs them; none is a
        program of its own, and shared libraries need no x bit)."""
        top = self.root / path.lstrip("/")
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            rel_dir = "/" + str(Path(dirpath).relative_to(self.root))
            os.chmod(dirpath, 0o755)
            self.entries.append(Entry(rel_dir, "dir", 0o755))
            for name in sorted(filenames):
                (Path(dirpath) / name).chmod(0o644)
                self.entries.append(Entry(f"{rel_dir}/{name}", "file", 0o644))


def log(message: str) -> None:
    print(f"build: {message}", file=sys.stderr, flush=True)


def run(argv: Sequence[str], cwd: Optional[Path] = None, env: Optional[Dict[str, str]] = None,
        timeout_seconds: float = 900) -> str:
    try:
        result = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True,
                                timeout=timeout_seconds, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise BuildError(f"{argv[0]} is not installed (see packaging/README.md: build requirements)") from None
    except subprocess.TimeoutExpired:
        raise BuildError(f"{' '.join(argv[:3])} ... took longer than {timeout_seconds:.0f} s") from None
    if result.returncode != 0:
        tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-6:])
        raise BuildError(f"{' '.join(argv[:4])} ... exited {result.returncode}: {tail}")
    return result.stdout


# --- 1. wheelhouse ------------------------------------------------------------------------------------------------

def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def requirements(extra: Optional[str] = None) -> List[str]:
    """The runtime requirements from pyproject.toml, or those of one extra."""
    proj = project()
    return list(proj["optional-dependencies"][extra]) if extra else list(proj["dependencies"])


def pip_target_args(python_version: str) -> List[str]:
    args = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
            "--abi", abi(python_version)]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    return args


def wheelhouse_dir(wheelhouse: Path, python_version: str, reqs: Sequence[str], constraints: Sequence[str]) -> Path:
    blob = json.dumps({"python": python_version, "platforms": PLATFORMS, "reqs": list(reqs),
                       "constraints": list(constraints), "format": WHEELHOUSE_FORMAT}, sort_keys=True)
    return wheelhouse / f"{abi(python_version)}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def fetch_wheels(python: str, wheelhouse: Path, target: Target, python_version: str, reqs: Sequence[str],
                 offline: bool, constraints: Sequence[str] = ()) -> Path:
    """The directory holding exactly the wheels ``reqs`` resolve to for ``python_version``; downloaded once."""
    where = wheelhouse_dir(wheelhouse, python_version, reqs, constraints)
    if (where / "COMPLETE").is_file():
        return where
    if offline:
        raise BuildError(f"no wheels for {target.name} (Python {python_version}) in {where} and --offline was "
                         f"given: run once without --offline (it downloads them from PyPI)")
    log(f"downloading wheels for Python {python_version} into {where}")
    wheelhouse.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=where.name + ".partial-", dir=wheelhouse))
    try:
        (partial / "requirements.txt").write_text("\n".join(reqs) + "\n")
        argv = [python, str(PACKAGING / "pip_for_target.py"), python_version, "download", "-q",
                "--disable-pip-version-check", "--dest", str(partial), *pip_target_args(python_version),
                "-r", str(partial / "requirements.txt")]
        if constraints:
            (partial / "constraints.txt").write_text("\n".join(constraints) + "\n")
            argv += ["-c", str(partial / "constraints.txt")]
        run(argv, timeout_seconds=900)
        (partial / "COMPLETE").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
        shutil.rmtree(where, ignore_errors=True)
        partial.rename(where)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return where


def wheels_in(where: Path) -> List[Path]:
    return sorted(where.glob("*.whl"))


def wheel_project(wheel: Path) -> str:
    return re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()


def install_wheels(python: str, python_version: str, wheels: Sequence[Path], dest: Path) -> None:
    """Unpack the given wheels (no resolution, no index: exactly these) for one Python's ABI into ``dest``."""
    if not wheels:
        return
    run([python, "-m", "pip", "install", "-q", "--isolated", "--disable-pip-version-check", "--no-index", "--no-deps",
         "--no-compile", "--no-warn-script-location", "--target", str(dest), *pip_target_args(python_version),
         *[str(w) for w in wheels]], timeout_seconds=600)
    shutil.rmtree(dest / "bin", ignore_errors=True)  # console scripts with the build machine's shebang
    for cache in dest.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)


# --- 2. stage -----------------------------------------------------------------------------------------------------

def launcher_text(source: Path, target: Target) -> str:
    """A launcher with the target's interpreter in its shebang."""
    text = source.read_text(encoding="utf-8")
    first, _, rest = text.partition("\n")
    if not first.startswith("#!/usr/bin/python3"):
        raise BuildError(f"{source}: expected a '#!/usr/bin/python3' shebang, found {first!r}")
    return first.replace("/usr/bin/python3", target.python, 1) + "\n" + rest


def copy_agent(stage: Stage, version: str) -> None:
    dest = stage.root / LIB.lstrip("/") / "agent"
    shutil.copytree(REPO / "agent", dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo"))
    init = dest / "__init__.py"
    text = init.read_text(encoding="utf-8")
    new_text, count = re.subn(r'^__version__ = "[^"]*"$', f'__version__ = "{version}"', text, flags=re.M)
    if count != 1:
        raise BuildError(f"{init}: no __version__ line to stamp")
    init.write_text(new_text, encoding="utf-8")
    stage.add_tree(LIB + "/agent")


WheelSets = Dict[str, List[Path]]  # Python X.Y -> the wheels resolved for it


def stage_vendor(stage: Stage, tree: str, wheel_sets: WheelSets, python: str) -> None:
    """One whole vendor tree per Python under ``tree/cpXY`` (the launcher puts the running interpreter's first)."""
    stage.add_dir(tree)
    for python_version, wheels in wheel_sets.items():
        install_wheels(python, python_version, wheels, stage.root / tree.lstrip("/") / abi(python_version))
        stage.add_tree(f"{tree}/{abi(python_version)}")


def stage_agent(stage: Stage, target: Target, version: str, vendor_wheels: WheelSets, python: str) -> None:
    """The gpuguard package's installed tree."""
    stage.add_dir("/usr/lib/gpuguard")
    copy_agent(stage, version)
    stage_vendor(stage, LIB + "/vendor", vendor_wheels, python)
    stage.add_file(PACKAGING / "launchers/gpuguard", "/usr/bin/gpuguard", 0o755,
                   text=launcher_text(PACKAGING / "launchers/gpuguard", target))
    stage.add_file(REPO / "policies/amd-compat-matrix.toml", "/usr/share/gpuguard/amd-compat-matrix.toml")
    # gpuguard's knowledge tables (agent/policy/knowledge_files.py reads them here; a signed bundle may carry newer)
    stage.add_dir("/usr/share/gpuguard/knowledge")
    for table in sorted((REPO / "policies/knowledge").glob("*.toml")):
        stage.add_file(table, f"/usr/share/gpuguard/knowledge/{table.name}")
    stage.add_file(REPO / "systemd/gpuguard.service", f"{target.unit_dir}/gpuguard.service")
    stage.add_dir("/etc/gpuguard")
    stage.add_dir("/etc/gpuguard/policy.d")
    stage.add_dir("/etc/gpuguard/keys")  # trusted keyrings for signed policy bundles (docs/guard.md)
    stage.add_file(PACKAGING / "config/agent.toml", "/etc/gpuguard/agent.toml", config=True)
    stage.add_file(REPO / "policies/example.toml", "/etc/gpuguard/example-policy.toml", config=True,
                   text="# Inactive example: copy it to /etc/gpuguard/policy.d/10-site.toml, edit, then run\n"
                        "# `gpuguard policy check` and `gpuguard policy compile`\n"
                        "# (see /usr/share/doc/gpuguard/guard.md).\n"
                        + (REPO / "policies/example.toml").read_text(encoding="utf-8"))
    stage.add_dir("/var/lib/gpuguard", 0o750)
    if target.manager == "apt":
        stage.add_file(PACKAGING / "apt/gpuguard-apt-hook", LIB + "/gpuguard-apt-hook", 0o755,
                       text=launcher_text(PACKAGING / "apt/gpuguard-apt-hook", target))
        stage.add_file(PACKAGING / "apt/50gpuguard", "/etc/apt/apt.conf.d/50gpuguard", config=True)
    elif target.manager == "dnf":
        stage_dnf(stage, target)
    else:
        stage_zypper(stage, target)
    docs = "/usr/share/doc/gpuguard"
    stage.add_file(REPO / "README.md", f"{docs}/README.md")
    for doc in ("guard.md", "reporting.md", "hub.md", "packaging.md", "health.md"):
        if (REPO / "docs" / doc).is_file():
            stage.add_file(REPO / "docs" / doc, f"{docs}/{doc}")
    if target.fmt == "deb":
        stage.add_file(PACKAGING / "deb/copyright", f"{docs}/copyright")
        stage.add_file(Path(), f"{docs}/changelog.Debian.gz", data=deb_changelog("gpuguard", target, version))
        stage.add_file(PACKAGING / "deb/gpuguard.lintian-overrides", "/usr/share/lintian/overrides/gpuguard")
    stage.add_file(Path(), "/usr/share/man/man1/gpuguard.1.gz",
                   data=gzip.compress((PACKAGING / "man/gpuguard.1").read_bytes(), 9, mtime=0))
    for path, text in completion_files(target).items():
        stage.add_file(Path(), path, text=text)


def completion_files(target: Target) -> Dict[str, str]:
    """bash and zsh completion generated from the CLI's parser (packaging/completion.py), where each family's
    shells look for them: zsh's vendor-completions on Debian/Ubuntu, site-functions on RHEL."""
    sys.path.insert(0, str(PACKAGING))
    from completion import render

    zsh_dir = "/usr/share/zsh/vendor-completions" if target.fmt == "deb" else "/usr/share/zsh/site-functions"
    return {"/usr/share/bash-completion/completions/gpuguard": render("bash"), f"{zsh_dir}/_gpuguard": render("zsh")}


def stage_dnf(stage: Stage, target: Target) -> None:
    """The dnf4 plugin, its config, the dnf5 actions file and both checkers' launchers, when the repo has them."""
    dnf, dnf5 = PACKAGING / "dnf", PACKAGING / "dnf5"
    if (dnf / "gpuguard-dnf-check").is_file():
        stage.add_file(dnf / "gpuguard-dnf-check", LIB + "/gpuguard-dnf-check", 0o755,
                       text=launcher_text(dnf / "gpuguard-dnf-check", target))
    if (dnf / "gpuguard.py").is_file():
        for plugin_dir in target.dnf_plugin_dirs:
            stage.add_file(dnf / "gpuguard.py", f"{plugin_dir}/gpuguard.py")
    if (dnf / "gpuguard.conf").is_file():
        stage.add_file(dnf / "gpuguard.conf", "/etc/dnf/plugins/gpuguard.conf", config=True)
    if (dnf5 / "gpuguard-dnf5-action").is_file():
        stage.add_file(dnf5 / "gpuguard-dnf5-action", LIB + "/gpuguard-dnf5-action", 0o755,
                       text=launcher_text(dnf5 / "gpuguard-dnf5-action", target))
    if (dnf5 / "gpuguard.actions").is_file():
        stage.add_file(dnf5 / "gpuguard.actions", "/etc/dnf/libdnf5-plugins/actions.d/gpuguard.actions", config=True)


# ---- zypper guard (issue #41) ---------------------------------------------------------------------------------
# The SLES targets carry the zypper guard's files (packaging/zypper/README.md says what each is): the hook the rpm
# plugin runs and the libzypp commit plugin (launchers, given the target's interpreter), the rpm macros that load
# the plugin, and the plugin itself, gpuguard.so, compiled here (build_rpm_plugin).
# Each entry is (repo file, installed path, mode, conffile); tests/packaging/test_targets_2026.py checks them.
ZYPPER_FILES: Tuple[Tuple[str, str, int, bool], ...] = (
    ("packaging/zypper/gpuguard-zypper-hook", "/usr/lib/gpuguard/gpuguard-zypper-hook", 0o755, False),
    ("packaging/zypper/gpuguard-zypper-commit", "/usr/lib/zypp/plugins/commit/gpuguard", 0o755, False),
    ("packaging/zypper/macros.transaction_gpuguard", "/usr/lib/rpm/macros.d/macros.transaction_gpuguard", 0o644,
     False),
)
RPM_PLUGIN_SOURCE = PACKAGING / "zypper/gpuguard-rpm-plugin.c"
RPM_PLUGIN_PATH = "/usr/lib64/rpm-plugins/gpuguard.so"  # rpm's %{__plugindir} on SLES 15 and 16
# No -lrpm -lrpmio: the plugin has no DT_NEEDED on librpm (this machine's librpm.so.9 is neither SLES 15's .so.8
# nor SLES 16's .so.10); its librpm calls bind to the librpm already loaded by the rpm process that dlopens it.
# It calls only API that rpm 4.14 to 4.20 all have (packaging/zypper/README.md). -s: no symbols but the dynamic ones.
RPM_PLUGIN_CFLAGS = ("-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-s")
RPM_HEADER_PROBE = "#include <rpm/rpmts.h>\n#include <rpm/rpmmacro.h>\n"
BUILD_DEPS_HINT = "apt-get install gcc librpm-dev (scripts/test-packages.txt)"


def rpm_plugin_compiler() -> str:
    """The gcc that builds the rpm plugin, once librpm's headers are known to be there (one-line errors if not)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError(f"gcc is not installed: the sles targets compile the zypper guard's rpm plugin "
                         f"({BUILD_DEPS_HINT})")
    probe = subprocess.run([gcc, "-E", "-x", "c", "-o", os.devnull, "-"], input=RPM_HEADER_PROBE, text=True,
                           capture_output=True, timeout=120, check=False)
    if probe.returncode != 0:
        raise BuildError(f"librpm's headers (rpm/rpmts.h) are not installed: the sles targets compile the zypper "
                         f"guard's rpm plugin ({BUILD_DEPS_HINT})")
    return gcc


def build_rpm_plugin(gcc: str, dest: Path) -> None:
    """Compile packaging/zypper/gpuguard-rpm-plugin.c into ``dest`` (RPM_PLUGIN_CFLAGS say how and why)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    run([gcc, *RPM_PLUGIN_CFLAGS, "-o", str(dest), str(RPM_PLUGIN_SOURCE)], timeout_seconds=300)


def stage_zypper(stage: Stage, target: Target) -> None:
    """The zypper guard's files (ZYPPER_FILES) and the compiled rpm plugin; launchers get the target's
    interpreter."""
    for source, path, mode, config in ZYPPER_FILES:
        source_path = REPO / source
        text = launcher_text(source_path, target) if mode & 0o111 else None
        stage.add_file(source_path, path, mode, config=config, text=text)
    plugin = stage.root.parent / f"{target.name}-gpuguard.so"
    build_rpm_plugin(rpm_plugin_compiler(), plugin)
    stage.add_file(plugin, RPM_PLUGIN_PATH, 0o755)


def stage_hub(stage: Stage, target: Target, version: str, hub_wheels: WheelSets, python: str) -> None:
    """The gpuguard-hub package: hub-only vendored wheels, its unit and config."""
    stage_vendor(stage, LIB + "/vendor-hub", hub_wheels, python)
    stage.add_file(REPO / "systemd/gpuguard-hub.service", f"{target.unit_dir}/gpuguard-hub.service")
    stage.add_file(PACKAGING / "config/hub.toml", "/etc/gpuguard/hub.toml", config=True)
    docs = "/usr/share/doc/gpuguard-hub"
    stage.add_file(REPO / "docs/hub.md", f"{docs}/hub.md")
    if target.fmt == "deb":
        stage.add_file(PACKAGING / "deb/copyright", f"{docs}/copyright")
        stage.add_file(Path(), f"{docs}/changelog.Debian.gz", data=deb_changelog("gpuguard-hub", target, version))
        stage.add_file(PACKAGING / "deb/gpuguard-hub.lintian-overrides", "/usr/share/lintian/overrides/gpuguard-hub")


# --- 3. package ---------------------------------------------------------------------------------------------------

def changelog_date() -> Tuple[str, str]:
    """(RFC 2822 date, rpm %changelog date) of the source: the last commit, or now outside git."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if not epoch:
        try:
            epoch = run(["git", "-C", str(REPO), "log", "-1", "--format=%ct"]).strip()
        except BuildError:
            epoch = ""
    stamp = time.gmtime(int(epoch) if epoch.isdigit() else time.time())
    return time.strftime("%a, %d %b %Y %H:%M:%S +0000", stamp), time.strftime("%a %b %d %Y", stamp)


def deb_version(target: Target, version: str, release: str) -> str:
    return f"{version}-{release}{target.version_suffix}"


def deb_changelog(package: str, target: Target, version: str) -> bytes:
    text = (f"{package} ({deb_version(target, version, '1')}) unstable; urgency=medium\n\n"
            f"  * Build of {version} for {target.distro} (build.sh --target {target.name}).\n\n"
            f" -- {MAINTAINER}  {changelog_date()[0]}\n")
    return gzip.compress(text.encode(), 9, mtime=0)


def maintainer_script(name: str, target: Target) -> str:
    text = (PACKAGING / "deb" / name).read_text(encoding="utf-8")
    return text.replace("@PYTHON@", target.python).replace("@UNIT_DIR@", target.unit_dir)


def build_deb(stage: Stage, target: Target, package: str, version: str, release: str, out: Path,
              depends: Sequence[str], summary: str, description: str, scripts: Sequence[str]) -> Path:
    debian = stage.root / "DEBIAN"
    debian.mkdir()
    size_kib = sum(f.stat().st_size for f in stage.root.rglob("*") if f.is_file()) // 1024 + 1
    full_version = deb_version(target, version, release)
    body = "\n".join(f" {line}" if line else " ." for line in description.splitlines())
    control = [f"Package: {package}", f"Version: {full_version}", "Architecture: amd64", f"Maintainer: {MAINTAINER}",
               f"Installed-Size: {size_kib}", f"Depends: {', '.join(depends)}", "Section: admin",
               "Priority: optional", f"Homepage: {HOMEPAGE}", f"Description: {summary}", body]
    (debian / "control").write_text("\n".join(control) + "\n")
    conffiles = [e.path for e in stage.entries if e.config]
    if conffiles:
        (debian / "conffiles").write_text("\n".join(conffiles) + "\n")
    for script in scripts:
        path = debian / script
        path.write_text(maintainer_script(f"{package}.{script}", target))
        path.chmod(0o755)
    sums = []
    for e in stage.entries:
        if e.kind == "file":
            digest = hashlib.md5((stage.root / e.path.lstrip("/")).read_bytes()).hexdigest()  # noqa: S324 - dpkg's format
            sums.append(f"{digest}  {e.path.lstrip('/')}")
    (debian / "md5sums").write_text("\n".join(sums) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    deb = out / f"{package}_{full_version}_amd64.deb"
    run(["dpkg-deb", "--root-owner-group", "-Zxz", "-z1", "--build", str(stage.root), str(deb)], timeout_seconds=600)
    return deb


def rpm_files_section(stage: Stage) -> str:
    lines = []
    for e in stage.entries:
        quoted = f'"{e.path}"' if " " in e.path else e.path
        if e.kind == "dir":
            lines.append(f"%dir %attr({e.mode:04o},root,root) {quoted}")
        elif e.doc:
            lines.append(f"%doc %attr({e.mode:04o},root,root) {quoted}")
        elif e.config:
            lines.append(f"%config(noreplace) %attr({e.mode:04o},root,root) {quoted}")
        else:
            lines.append(f"%attr({e.mode:04o},root,root) {quoted}")
    return "\n".join(lines)


def build_rpm(stage: Stage, target: Target, package: str, version: str, release: str, out: Path,
              requires: Sequence[str], summary: str, description: str, work: Path) -> Path:
    template = (PACKAGING / "rpm" / f"{package}.spec.in").read_text(encoding="utf-8")
    spec_text = (template.replace("@NAME@", package).replace("@VERSION@", version)
                 .replace("@RELEASE@", release + target.version_suffix).replace("@SUMMARY@", summary)
                 .replace("@DESCRIPTION@", description).replace("@PYTHON@", target.python)
                 .replace("@UNIT_DIR@", target.unit_dir)
                 .replace("@REQUIRES@", "\n".join(f"Requires:       {r}" for r in requires))
                 .replace("@STAGE@", str(stage.root)).replace("@FILES@", rpm_files_section(stage))
                 .replace("@CHANGELOG_DATE@", changelog_date()[1]).replace("@MAINTAINER@", MAINTAINER)
                 .replace("@DISTRO@", target.distro).replace("@TARGET@", target.name))
    topdir = work / "rpmbuild"
    for sub in ("BUILD", "RPMS", "SPECS", "SRPMS", "BUILDROOT"):
        (topdir / sub).mkdir(parents=True, exist_ok=True)
    spec = topdir / "SPECS" / f"{package}.spec"
    spec.write_text(spec_text)
    run(["rpmbuild", "-bb", "--quiet", "--target", "x86_64-linux", "--define", f"_topdir {topdir}",
         "--define", "_binary_payload w1.xzdio", "--define", "_build_id_links none",
         "--define", "debug_package %{nil}", "--define", "__os_install_post %{nil}",
         "--define", "_binary_filedigest_algorithm 8", str(spec)], timeout_seconds=600)
    built = list((topdir / "RPMS").rglob("*.rpm"))
    if len(built) != 1:
        raise BuildError(f"rpmbuild made {len(built)} packages, expected 1")
    out.mkdir(parents=True, exist_ok=True)
    dest = out / built[0].name
    shutil.move(str(built[0]), dest)
    return dest


# --- command ------------------------------------------------------------------------------------------------------

def build(target: Target, version: str, release: str, out: Path, wheelhouse: Path, offline: bool, python: str,
          hub: bool) -> List[Path]:
    started = time.monotonic()
    if target.manager == "zypper":
        rpm_plugin_compiler()  # a missing gcc or librpm-dev fails before any download
    agent_reqs = requirements()
    agent_wheels = {v: wheels_in(fetch_wheels(python, wheelhouse, target, v, agent_reqs, offline))
                    for v in target.python_versions}
    requires = (*target.python_depends(), *target.depends)
    built = []
    with tempfile.TemporaryDirectory(prefix="gpuguard-build-") as tmp:
        work = Path(tmp)
        stage = Stage(work / "stage-gpuguard")
        stage_agent(stage, target, version, agent_wheels, python)
        scripts = ("preinst", "postinst", "prerm", "postrm")
        if target.fmt == "deb":
            built.append(build_deb(stage, target, "gpuguard", version, release, out, requires, SUMMARY,
                                   DESCRIPTION, scripts))
        else:
            built.append(build_rpm(stage, target, "gpuguard", version, release, out, requires, SUMMARY,
                                   DESCRIPTION, work))
        if hub:
            hub_wheels = {}
            for python_version, wheels in agent_wheels.items():
                # The hub's wheels resolve with the agent's pinned, so both vendor trees agree on shared packages.
                pins = [f"{w.name.split('-')[0]}=={w.name.split('-')[1]}" for w in wheels]
                hub_house = fetch_wheels(python, wheelhouse, target, python_version,
                                         agent_reqs + requirements("hub"), offline, pins)
                have = {wheel_project(w) for w in wheels}
                hub_wheels[python_version] = [w for w in wheels_in(hub_house) if wheel_project(w) not in have]
            hub_stage = Stage(work / "stage-hub")
            stage_hub(hub_stage, target, version, hub_wheels, python)
            if target.fmt == "deb":
                depends = (f"gpuguard (= {deb_version(target, version, release)})", "libc6 (>= 2.28)")
                built.append(build_deb(hub_stage, target, "gpuguard-hub", version, release, out, depends,
                                       HUB_SUMMARY, HUB_DESCRIPTION, ("preinst", "postinst", "prerm", "postrm")))
            else:
                hub_requires = (f"gpuguard = {version}-{release}{target.version_suffix}",)
                built.append(build_rpm(hub_stage, target, "gpuguard-hub", version, release, out, hub_requires,
                                       HUB_SUMMARY, HUB_DESCRIPTION, work))
    for path in built:
        log(f"built {path} ({path.stat().st_size / 1e6:.1f} MB)")
    log(f"{target.name}: done in {time.monotonic() - started:.1f} s")
    return built


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="packaging/build.sh", description="Build gpuguard's .deb or .rpm for one "
                                                                            "target (packaging/README.md).")
    parser.add_argument("--target", required=True, choices=sorted(TARGETS))
    parser.add_argument("--version", default=project()["version"], help="package version (default: pyproject.toml)")
    parser.add_argument("--release", default="1", help="package revision/release number (default 1)")
    parser.add_argument("--out", default=str(REPO / "dist"), help="where the packages go (default dist/)")
    parser.add_argument("--wheelhouse", default=os.environ.get("GPUGUARD_WHEELHOUSE", str(REPO / "build/wheelhouse")),
                        help="downloaded wheels, reused by later builds (default build/wheelhouse, or "
                             "$GPUGUARD_WHEELHOUSE)")
    parser.add_argument("--offline", action="store_true", help="never download: fail when a wheel set is missing")
    parser.add_argument("--no-hub", dest="hub", action="store_false", help="skip the gpuguard-hub package")
    parser.add_argument("--python", default=sys.executable, help="the Python whose pip downloads and unpacks wheels "
                                                                 "(default: this one)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+~]*", args.version) or not re.fullmatch(r"[0-9][0-9A-Za-z.+]*",
                                                                                     args.release):
        print(f"build: error: bad --version {args.version!r} or --release {args.release!r}", file=sys.stderr)
        return 2
    try:
        build(TARGETS[args.target], args.version, args.release, Path(args.out).resolve(),
              Path(args.wheelhouse).resolve(), args.offline, args.python, args.hub)
    except BuildError as exc:
        print(f"build: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
