"""Helpers for health tests: snapshots with a GPU inventory, fake SMI modules, settings, fake-probe hosts."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import pwd
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from agent.collectors.base import Section, Status
from agent.collectors.kernel import KernelInfo
from agent.collectors.nvidia import NvidiaGpu, NvidiaInfo
from agent.health.settings import HealthSettings
from agent.host import Host
from agent.snapshot.model import SECTION_NAMES, Snapshot
from tests.conftest import fake_module_loader, fixed_clock, tmpfs_at
from tests.fakes.runner import FakeRunner

FAKE_PROBE = Path(__file__).parent / "probes" / "fake_probe.py"
FIXED = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def make_snapshot(nvidia_gpus: int = 1, driver: str = "580.159.04", kernel: str = "6.18.44") -> Snapshot:
    """A snapshot whose only facts are the kernel and an NVIDIA driver with ``nvidia_gpus`` H200s."""
    sections: Dict[str, Any] = {name: Section(status=Status.ABSENT, reason="test") for name in SECTION_NAMES}
    sections["kernel"] = Section[KernelInfo](status=Status.OK, data=KernelInfo(running_release=kernel))
    if nvidia_gpus:
        gpus = [NvidiaGpu(index=i, bdf=f"0000:00:0{6 + i}.0", name="NVIDIA H200") for i in range(nvidia_gpus)]
        sections["nvidia"] = Section[NvidiaInfo](status=Status.OK, data=NvidiaInfo(
            module_loaded=True, driver_version=driver, cuda_driver_version="13.0", source="nvml", gpus=gpus))
    return Snapshot(agent_version="test", hostname="test", taken_at=FIXED, **sections)


H200_BYTES = 150754820096
WORK_BYTES = 9697240064  # the real probe's device-memory peak on the H100 and H200 (docs/hardware/)


def make_fake_nvml(readings: Sequence[Sequence[float]], bus_ids: Sequence[str] = ("00000000:00:06.0",),
                   init_error: Optional[str] = None,
                   processes: Sequence[Sequence[Sequence[Tuple[int, Optional[int]]]]] = ((),),
                   free_bytes: Optional[Sequence[int]] = None,
                   used_bytes: Optional[Sequence[Sequence[int]]] = None) -> types.ModuleType:
    """A fake pynvml: utilization of each GPU follows ``readings`` (one row per call round, the last repeats).

    ``processes[k][gpu]`` are the (pid, used bytes) that the k-th process listing of that GPU returns (the first one
    is the look before the probe; the last repeats); ``free_bytes[gpu]`` its free memory (all free by default).
    Device memory follows the rounds as utilization does: ``used_bytes[k][gpu]``, where given, is the memory in use
    while utilization row k is the latest read (the last row repeats); else, after the first row (the look before the
    probe), a GPU whose latest utilization is at least 50 % holds WORK_BYTES (the real probe's 9.7 GB) on top of what
    ``free_bytes`` leaves in use: the probe's work shows in its memory as in its utilization.
    """
    module = types.ModuleType("pynvml")
    state: Dict[str, Any] = {"round": 0, "calls": [], "listings": {}}

    class NVMLError(Exception):
        pass

    def nvmlInit() -> None:
        state["calls"].append("nvmlInit")
        if init_error:
            raise NVMLError(init_error)

    def utilization(handle: int) -> Any:
        row = readings[min(state["round"], len(readings) - 1)]
        if handle == len(bus_ids) - 1:
            state["round"] += 1
        return types.SimpleNamespace(gpu=row[handle], memory=0)

    module.NVMLError = NVMLError
    module.nvmlInit = nvmlInit
    module.nvmlShutdown = lambda: state["calls"].append("nvmlShutdown")
    module.nvmlDeviceGetCount = lambda: len(bus_ids)
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus_ids[h].encode())
    module.nvmlDeviceGetUUID = lambda h: f"GPU-5a1b2c3d-0000-0000-0000-00000000000{h}"
    def running(handle: int) -> List[Any]:
        k = state["listings"].get(handle, 0)
        state["listings"][handle] = k + 1
        row = processes[min(k, len(processes) - 1)]
        procs = row[handle] if handle < len(row) else ()
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF,
                                      computeInstanceId=0xFFFFFFFF) for pid, used in procs]

    def memory(handle: int) -> Any:
        free = H200_BYTES if free_bytes is None else free_bytes[handle]
        latest = max(state["round"] - 1, 0)
        if used_bytes is not None:
            free = H200_BYTES - used_bytes[min(latest, len(used_bytes) - 1)][handle]
        elif latest >= 1 and readings[min(latest, len(readings) - 1)][handle] >= 50.0:
            free = max(0, free - WORK_BYTES)
        return types.SimpleNamespace(total=H200_BYTES, free=free, used=H200_BYTES - free)

    module.nvmlDeviceGetUtilizationRates = utilization
    module.nvmlDeviceGetComputeRunningProcesses = running
    module.nvmlDeviceGetMemoryInfo = memory
    module.state = state
    return module


def make_fake_amdsmi(activity: Sequence[Any], bdfs: Sequence[str] = ("0000:c1:00.0",),
                     processes: Sequence[Sequence[Dict[str, Any]]] = (), vram_used_mb: Sequence[int] = (),
                     vram_used_rows: Sequence[Sequence[int]] = ()) -> types.ModuleType:
    """A fake amdsmi whose gfx_activity is ``activity[i]`` for GPU i (a number or "N/A"), with ``processes[i]`` (the
    dicts amdsmi_get_gpu_process_list returns) and ``vram_used_mb[i]`` of 196,592 MB (an MI300X); where given,
    ``vram_used_rows[k][i]`` replaces it while the k-th round of activity readings is the latest (the last repeats)."""
    module = types.ModuleType("amdsmi")
    calls: List[str] = []
    rounds = {"read": 0}

    def gpu_activity(h: int) -> Dict[str, Any]:
        if h == len(bdfs) - 1:
            rounds["read"] += 1
        return {"gfx_activity": activity[h], "umc_activity": "N/A", "mm_activity": "N/A"}

    def vram_used(h: int) -> int:
        if vram_used_rows:
            return vram_used_rows[min(max(rounds["read"] - 1, 0), len(vram_used_rows) - 1)][h]
        return vram_used_mb[h] if h < len(vram_used_mb) else 0

    module.amdsmi_init = lambda: calls.append("amdsmi_init")
    module.amdsmi_shut_down = lambda: calls.append("amdsmi_shut_down")
    module.amdsmi_get_processor_handles = lambda: list(range(len(bdfs)))
    module.amdsmi_get_gpu_device_bdf = lambda h: bdfs[h]
    module.amdsmi_get_gpu_activity = gpu_activity
    module.amdsmi_get_gpu_process_list = lambda h: list(processes[h]) if h < len(processes) else []
    module.amdsmi_get_gpu_vram_usage = lambda h: {"vram_total": 196592, "vram_used": vram_used(h)}
    module.calls = calls
    return module


def memory_unverified(unverified: Sequence[str]) -> bool:
    """Whether corroboration's memory rule said it could not judge (too few SMI readings, or too far apart)."""
    return any("device memory not checked" in line for line in unverified)


def make_host(modules: Optional[Dict[str, types.ModuleType]] = None, root: Optional[Path] = None) -> Host:
    """A Host with the test process's PATH (so interpreters resolve), fake SMI modules and no recorded commands."""
    return Host(root=root or Path("/nonexistent-root"), runner=FakeRunner(),
                load_module=fake_module_loader(modules or {}), clock=fixed_clock,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})


def fake_probe_settings(*probe_args: str, **overrides: Any) -> HealthSettings:
    """Settings that run tests/health/probes/fake_probe.py (through ``python``) with the given arguments."""
    # The probe runs as the test's own user (as root here, explicitly; tests of the drop to another user set run_as).
    # Its timeout is generous: a probe ends when it is done, and a loaded machine must not turn a pass into a timeout.
    values: Dict[str, Any] = {"python": sys.executable, "probe_args": list(probe_args), "timeout_seconds": 120.0,
                              "activity_interval_seconds": 0.01, "baseline_runs": 3,
                              "busy_utilization_confirm_seconds": 0.01,
                              "run_as": pwd.getpwuid(os.geteuid()).pw_name}
    values.update(overrides)
    return HealthSettings(**values)


def pids_with(token: str) -> list:
    """Host pids of the processes whose command line holds ``token``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if token.encode() in Path("/proc", name, "cmdline").read_bytes().split(b"\0"):
                    found.append(int(name))
            except OSError:
                continue
    return found


def gone_within(token: str, seconds: float) -> list:
    """The processes holding ``token`` still alive (not zombies) after up to ``seconds``; [] once all are gone."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [pid for pid in pids_with(token) if process_state(pid) not in ("Z", None)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def process_state(pid: int) -> "str | None":
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def system_python() -> str:
    """An interpreter every user can run (this one may live under /root): the system's of this release."""
    python = f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"
    return python if os.access(python, os.X_OK) else "/usr/bin/python3"


def hostile_interpreter(directory: Path) -> Tuple[Path, Path]:
    """(interpreter, mode file): a stand-in for the host's ML interpreter that any user can run. Whatever probe it is
    handed, it runs fake_probe.py with the interpreter flags it got (-I, -u) and the mode the file says."""
    mode = directory / "mode"
    mode.write_text("pass")
    python = directory / "ml-python"
    # The limits trampoline (python -I -S -c CODE ...) runs as it is; it execs this again with the probe's argv.
    python.write_text("#!/bin/sh\nflags=\"\"\n"
                      "while [ $# -gt 0 ] && [ \"$1\" != -c ] && [ \"${1#-}\" != \"$1\" ]; do flags=\"$flags $1\"; "
                      "shift; done\n"
                      f"[ \"$1\" = -c ] && exec {system_python()} $flags \"$@\"\n"
                      f"exec {system_python()} $flags {FAKE_PROBE} --mode $(cat {mode})\n")
    python.chmod(0o755)
    mode.chmod(0o644)
    return python, mode


@contextlib.contextmanager
def shared_directory() -> Iterator[Path]:
    """A directory the probe's user (nobody) can reach, removed after (pytest's own tmp tree is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="gpuguard-h39-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def small_filesystem(size_mib: int) -> Iterator[Path]:
    """A tmpfs of ``size_mib`` MiB that anyone can reach, unmounted after (needs root; skipped where refused)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    with shared_directory() as path, tmpfs_at(path, f"size={size_mib}m,mode=0755"):
        yield path
H200_ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "roots" / "nvidia-h200-ubuntu2404"


def nvidia_root(tmp_path: Path, model: str = "NVIDIA H200", gpus: int = 1) -> Path:
    """A host root modelled on the H200 fixture's (driver 580.159.04, /proc/driver/nvidia) with ``gpus`` GPUs of
    ``model`` at the PCI addresses and UUIDs fake_probe.py names (0000:00:06.0, ...; 5a1b2c3d-...-00000000000N)."""
    root = tmp_path / f"root-{gpus}x{model.replace(' ', '_')}"
    for relative in ("proc/driver/nvidia/version", "sys/module/nvidia/version", "etc/os-release",
                     "proc/sys/kernel/osrelease"):
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((H200_ROOT / relative).read_bytes())
    (root / "dev").mkdir(parents=True, exist_ok=True)
    template = (H200_ROOT / "proc/driver/nvidia/gpus/0000:18:00.0/information").read_text()
    for i in range(gpus):
        bdf = f"0000:00:{6 + i:02x}.0"
        info = (template.replace("NVIDIA H200", model).replace("0000:18:00.0", bdf)
                .replace("GPU-5f0a3c7e-9b1d-4e2a-8c6f-2d4b7a9e1f03", f"GPU-5a1b2c3d-0000-0000-0000-00000000000{i}")
                .replace("Device Minor: \t 0", f"Device Minor: \t {i}"))
        gpu_dir = root / "proc/driver/nvidia/gpus" / bdf
        gpu_dir.mkdir(parents=True, exist_ok=True)
        (gpu_dir / "information").write_text(info)
        (root / "dev" / f"nvidia{i}").write_text("")
    return root


def wrapper_python(tmp_path: Path, *probe_args: str) -> Path:
    """A stand-in for the host's ML interpreter: whatever probe and limits it is handed, it runs fake_probe.py
    with ``probe_args`` (what a hostile environment could make the probe print)."""
    python = tmp_path / "ml-python"
    python.write_text(f"#!{sys.executable}\nimport os, sys\n"
                      f"os.execv(sys.executable, [sys.executable, {str(FAKE_PROBE)!r}, *{list(probe_args)!r}])\n")
    python.chmod(0o755)
    return python


def without_pid_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every supervised probe use the subreaper, as on a host where no private mount namespace can be made (a
    chroot, a container without CAP_SYS_ADMIN): the supervisor is asked with --no-pid-namespace."""
    from agent.health import launch

    real = launch.supervised_argv

    def subreaper_argv(argv: Any, sandbox: Any, pid_namespace: bool = True, report_fd: Any = None) -> Any:
        return real(argv, sandbox, False, report_fd)

    monkeypatch.setattr(launch, "supervised_argv", subreaper_argv)
