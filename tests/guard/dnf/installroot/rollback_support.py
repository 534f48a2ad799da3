"""Helpers for the rpm rollback and versionlock tests on top of the dnf-guard installroot harness."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator, List, Sequence, Tuple

from agent.config import Settings
from agent.guard.dnf.backend import RpmBackend
from agent.guard.dnf.tool import DnfTool
from agent.host import Host, SubprocessRunner
from agent.statepaths import StatePaths
from tests.guard.dnf.installroot.harness import Installroot


def host_for(root: Installroot) -> Host:
    """A Host over the installroot whose commands see the harness's HOME (its .rpmmacros puts the rpmdb at
    /var/lib/rpm, as on RHEL)."""
    return Host(root=root.root, runner=SubprocessRunner(extra_env={"HOME": str(root.home)}))


def dnf_tool(root: Installroot, host: Host, lock_timeout_seconds: float = 5.0) -> DnfTool:
    """A DnfTool using the harness's dnf.conf (repository, plugin path) and release version."""
    return DnfTool(host, timeout_seconds=120, lock_timeout_seconds=lock_timeout_seconds,
                   options=["-c", str(root.dnf_conf), "--releasever=9"])


def backend_for_root(root: Installroot) -> RpmBackend:
    host = host_for(root)
    return RpmBackend(host, dnf_tool(root, host), StatePaths(Settings().agent.state_dir).rpms)


def events(root: Installroot) -> List[dict]:
    path = root.state_dir / "guard-events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def cached_rpms(root: Installroot) -> List[str]:
    directory = root.root / StatePaths(Settings().agent.state_dir).rpms.lstrip("/")
    return sorted(p.name for p in directory.glob("*.rpm")) if directory.is_dir() else []


def drop_from_repo(root: Installroot, file_name: str, keep_dir: Path) -> None:
    """Move one rpm out of the repository (to ``keep_dir``) and re-index it, as a vendor dropping an old build."""
    from tests.guard.dnf.installroot.harness import index_repo

    keep_dir.mkdir(parents=True, exist_ok=True)
    (root.repo_dir / file_name).rename(keep_dir / file_name)
    index_repo(root.repo_dir, root.work)
    forget_metadata(root)


def restore_repo(root: Installroot, keep_dir: Path) -> None:
    """Put back what drop_from_repo moved out and re-index."""
    from tests.guard.dnf.installroot.harness import index_repo

    moved = list(keep_dir.glob("*.rpm")) if keep_dir.is_dir() else []
    for path in moved:
        path.rename(root.repo_dir / path.name)
    if moved:
        index_repo(root.repo_dir, root.work)
        forget_metadata(root)


def forget_metadata(root: Installroot) -> None:
    """``dnf clean metadata`` after a re-index: createrepo_c's repomd revision is a time in seconds, so a re-index
    within the same second can look unchanged to dnf, which then lists a dropped build (seen in a full run)."""
    root.dnf("clean", "metadata", plugin=False, check=True)


DEBIAN_PLUGIN_DIR = "/usr/lib/python3/dist-packages/dnf-plugins"


def cli(root: Installroot, *argv: str, config: str = "/nonexistent/agent.toml") -> Tuple[int, str]:
    """Run the gpuguard CLI against the installroot with the harness's HOME (exit code, stdout)."""
    from agent.cli import main

    out = io.StringIO()
    code = main([*argv, "--root", str(root.root), "--config", config], make_host=lambda _: host_for(root), out=out)
    return code, out.getvalue()


def agent_config(root: Installroot) -> str:
    """An agent.toml whose [guard] dnf_options point dnf at the harness's dnf.conf."""
    path = root.work / "agent.toml"
    options = ", ".join(json.dumps(o) for o in ("-c", str(root.dnf_conf), "--releasever=9"))
    path.write_text(f"[guard]\ndnf_options = [{options}]\nlock_timeout_seconds = 5\n")
    return str(path)


def enable_versionlock(root: Installroot) -> Path:
    """Load Debian's dnf-plugins-core versionlock next to the gpuguard plugin; its list is the root's
    /etc/dnf/plugins/versionlock.list (returns a dnf.conf for :func:`dnf_vl`)."""
    locklist = root.root / "etc/dnf/plugins/versionlock.list"
    locklist.parent.mkdir(parents=True, exist_ok=True)
    conf_text = f"[main]\nenabled=1\nlocklist={locklist}\n"
    (root.plugin_conf_dir / "versionlock.conf").write_text(conf_text)
    (root.root / "etc/dnf/plugins/versionlock.conf").write_text(
        "[main]\nenabled=1\nlocklist=/etc/dnf/plugins/versionlock.list\n")
    conf = root.work / "dnf-versionlock.conf"
    conf.write_text("\n".join(f"pluginpath={line.split('=', 1)[1]},{DEBIAN_PLUGIN_DIR}"
                              if line.startswith("pluginpath=") else line
                              for line in root.dnf_conf.read_text().splitlines()) + "\n")
    return conf


def dnf_vl(root: Installroot, conf: Path, *args: str) -> subprocess.CompletedProcess:
    """/usr/bin/dnf against the root with the versionlock plugin loaded (and the gpuguard plugin off)."""
    from tests.guard.dnf.installroot.harness import run

    return run(["/usr/bin/dnf", "-c", str(conf), f"--installroot={root.root}", "--releasever=9",
                "--disableplugin=gpuguard", *args], root.env, check=False)


def guard_check(root: Installroot) -> Any:
    """One run of the rollback watcher over the installroot (no snapshot), as the daemon's guard job runs it."""
    from tests.guard.wiring import check

    backend = backend_for_root(root)
    return check(backend.host, Settings(), backend=backend, snapshot=lambda host: None)


@contextlib.contextmanager
def own_installroot(tmp_path_factory: Any, name: str, packages: Sequence[Any], policy: str) -> Iterator[Installroot]:
    """A module's own repository of ``packages`` and installroot with gpuguard and ``policy`` in it (skipped or
    failed like the session's when tools are missing); the caller installs its baseline and saves it with
    ``root.save(root.root.parent / "baseline")``; everything is removed after."""
    from tests import needs
    from tests.guard.dnf.installroot.harness import build_repo, missing_tools

    missing = missing_tools()
    if missing:
        needs.unavailable("installroot tests", f"missing: {', '.join(missing)}")
    base = tmp_path_factory.mktemp(name)
    root = Installroot(base / "root", build_repo(base / "repo", base / "rpmbuild", packages), base / "work")
    root.install_gpuguard(policy)
    try:
        yield root
    finally:
        shutil.rmtree(base, ignore_errors=True)


def back_to_baseline(root: Installroot) -> Installroot:
    """The root as :func:`own_installroot`'s caller saved it, with the plugin config rewritten."""
    root.restore(root.root.parent / "baseline")
    root.write_plugin_conf()
    return root
