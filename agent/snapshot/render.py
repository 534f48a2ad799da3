"""A readable one-screen summary of a snapshot for operators at a terminal."""

from __future__ import annotations

from typing import List

from agent.collectors.base import Section, Status
from agent.snapshot.model import SECTION_NAMES, Snapshot


def _status(section: Section) -> str:
    if section.status is Status.OK:
        return "ok"
    return f"{section.status.value}: {section.reason}"


def render_snapshot(snap: Snapshot) -> str:
    """Headline facts first, then one status line per section, then findings."""
    lines: List[str] = [f"host {snap.hostname}  {snap.content_hash}  (taken {snap.taken_at.isoformat()})"]
    if snap.os.data:
        lines.append(f"os       {snap.os.data.pretty_name or snap.os.data.id}")
    if snap.kernel.data:
        k = snap.kernel.data
        nxt = f"  next boot {k.next_boot}" + (" (REBOOT PENDING)" if k.reboot_pending else "") if k.next_boot else ""
        lines.append(f"kernel   {k.running_release}{nxt}")
    if snap.amdgpu.data:
        a = snap.amdgpu.data
        lines.append(f"amdgpu   {a.driver_version or '-'} ({a.driver_kind}, via {a.source}), {len(a.gpus)} GPU(s)")
        for gpu in a.gpus:
            vbios = gpu.vbios_version or gpu.vbios_part_number or '-'
            lines.append(f"  {gpu.bdf}  {gpu.market_name or '?'}  {gpu.gfx_target or ''}  vbios {vbios}")
    if snap.rocm.data:
        installed = ", ".join(f"{i.version or '?'} at {i.path}" for i in snap.rocm.data.installs)
        r = snap.rocm.data
        source = f" (read from {r.version_source})" if r.version_source else ""
        binding = r.amdsmi_binding
        pip = f", pip amdsmi {binding.version} in {binding.site_directory}" if binding else ""
        chosen = r.alternative
        via = (f", chosen by alternative {chosen.name}{' (' + chosen.mode + ')' if chosen.mode else ''}"
               f" -> {chosen.target}" if chosen else "")
        where = r.active_path or ("/usr/lib (the distribution's packages)" if r.packaged else "-")
        lines.append(f"rocm     {r.version or '-'}{source} at {where} (installed: {installed or 'none'}{pip}{via})")
        if r.packaged:
            lines.append("  packaged " + ", ".join(f"{c.package} {c.release or c.version}" for c in r.packaged))
    if snap.nvidia.data:
        n = snap.nvidia.data
        lines.append(f"nvidia   {n.driver_version or '-'} ({n.module_flavor or '?'} module, via {n.source}), "
                     f"CUDA driver API {n.cuda_driver_version or '-'}, {len(n.gpus)} GPU(s)")
        for nv_gpu in n.gpus:
            lines.append(f"  {nv_gpu.bdf}  {nv_gpu.name or '?'}  vbios {nv_gpu.vbios_version or '-'}")
    if snap.cuda.data:
        versions = ", ".join(t.version or t.path for t in snap.cuda.data.toolkits)
        lines.append(f"cuda     toolkits {versions or '-'}")
        if snap.cuda.data.packaged:
            lines.append(f"  packaged CUDA {snap.cuda.data.packaged_release or '?'}: "
                         + ", ".join(p.package for p in snap.cuda.data.packaged))
    if snap.containers.data:
        tools = ", ".join(f"{name} {t.version or '?'}" for name, t in sorted(snap.containers.data.tools.items()))
        lines.append(f"containers {tools or '-'}")
    packages = snap.packages()
    lines.append(f"packages {len(packages)} watched ({snap.package_manager or 'no package database'})")
    not_ok = [f"{name}={_status(getattr(snap, name))}" for name in SECTION_NAMES
              if getattr(snap, name).status is not Status.OK]
    lines.append("sections " + ("  ".join(not_ok) if not_ok else "all ok"))
    for finding in snap.findings:
        lines.append(f"[{finding.severity}] {finding.kind}: {finding.message}")
    return "\n".join(lines) + "\n"
