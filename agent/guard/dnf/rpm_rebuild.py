"""Rebuild the .rpm of an installed package from the rpm database, when no cache or repository has that build.

What rpmrebuild does: the header as ``rpm -q --qf`` gives it (name, epoch, version, release, arch, summary,
license, description, the Requires/Provides/Conflicts/Obsoletes with their versions, the scriptlets with their
interpreters) and the installed files with their modes, owners and flags (``%config``, ``%ghost``, ``%doc``),
written as a generated spec; the files are copied into a staging tree and ``rpmbuild -bb`` packs them with
automatic dependencies and every post-install step (strip, compression, build-id links) off, so the package
carries exactly what was installed. ``rpm -V`` says which files changed since installation: a changed or missing
file makes the package inexact, an edited ``%config`` file is carried as edited and listed. Commands go through
the Host seam (``rpm --root``, ``rpmbuild``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import List, Optional, Sequence, Set, Tuple

from agent.host import Host

SEP = "\x1f"
SECTION = "\n@@gpuguard-section@@\n"
DEPENDENCIES = (("Requires", "REQUIRE"), ("Provides", "PROVIDE"), ("Conflicts", "CONFLICT"),
                ("Obsoletes", "OBSOLETE"))
SCRIPTLETS = (("pre", "PREIN"), ("post", "POSTIN"), ("preun", "PREUN"), ("postun", "POSTUN"),
              ("pretrans", "PRETRANS"), ("posttrans", "POSTTRANS"))
# rpmbuild with nothing added or changed: no generated dependencies (the header's own are stated), no strip,
# compression, shebang mangling or build-id links, no debuginfo, the staging tree used as it is.
RPMBUILD_DEFINES = ("__spec_install_pre %{___build_pre}", "__os_install_post %{nil}", "_build_id_links none",
                    "debug_package %{nil}", "_binaries_in_noarch_packages_terminate_build 0",
                    "_missing_build_ids_terminate_build 0")


def query_format() -> str:
    """The ``rpm -q --qf`` format of everything a rebuild needs, in sections :func:`parse_query` reads."""
    header = SEP.join(f"%{{{t}}}" for t in ("NAME", "EPOCH", "VERSION", "RELEASE", "ARCH", "LICENSE", "SUMMARY"))
    parts = [header, "%{DESCRIPTION}"]
    for _, tag in DEPENDENCIES:
        parts.append(f"[%{{{tag}NAME}}{SEP}%{{{tag}FLAGS:depflags}}{SEP}%{{{tag}VERSION}}\n]")
    for _, tag in SCRIPTLETS:
        parts.append(f"%{{{tag}PROG}}{SEP}%{{{tag}}}")
    parts.append(f"[%{{FILENAMES}}{SEP}%{{FILEMODES:octal}}{SEP}%{{FILEUSERNAME}}{SEP}%{{FILEGROUPNAME}}{SEP}"
                 f"%{{FILEFLAGS:fflags}}{SEP}%{{FILELINKTOS}}\n]")
    return SECTION.join(parts)


@dataclass(frozen=True)
class RpmFile:
    path: str
    mode: int
    user: str
    group: str
    flags: str  # rpm's fflags: c config, d doc, g ghost, n noreplace, ...
    link_to: str


@dataclass(frozen=True)
class RpmHeader:
    name: str
    epoch: str
    version: str
    release: str
    arch: str
    license: str
    summary: str
    description: str
    dependencies: Tuple[Tuple[str, str], ...]  # (Requires|Provides|..., "name >= 1.0")
    scriptlets: Tuple[Tuple[str, str, str], ...]  # (section, interpreter, body)
    files: Tuple[RpmFile, ...]


def _none(value: str) -> str:
    return "" if value == "(none)" else value


def parse_query(text: str) -> RpmHeader:
    """The sections ``query_format`` printed; ValueError when they are not all there."""
    sections = text.split(SECTION)
    expected = 2 + len(DEPENDENCIES) + len(SCRIPTLETS) + 1
    if len(sections) != expected:
        raise ValueError(f"rpm -q printed {len(sections)} sections, not {expected}")
    name, epoch, version, release, arch, license_, summary = sections[0].split(SEP)
    dependencies = []
    for (label, _), section in zip(DEPENDENCIES, sections[2:2 + len(DEPENDENCIES)]):
        for line in section.splitlines():
            dep, flags, dep_version = (line.split(SEP) + ["", ""])[:3]
            if not dep or dep.startswith("rpmlib(") or (label == "Provides" and dep == name):
                continue
            dependencies.append((label, f"{dep} {flags.strip()} {dep_version}" if flags.strip() and dep_version
                                 else dep))
    scriptlets = []
    for (section_name, _), section in zip(SCRIPTLETS, sections[2 + len(DEPENDENCIES):-1]):
        prog, _, body = section.partition(SEP)
        if _none(prog) or _none(body):
            scriptlets.append((section_name, _none(prog) or "/bin/sh", _none(body)))
    files = []
    for line in sections[-1].splitlines():
        fields = line.split(SEP)
        if len(fields) == 6 and fields[0]:
            files.append(RpmFile(fields[0], int(fields[1], 8), fields[2], fields[3], fields[4], fields[5]))
    return RpmHeader(name, _none(epoch), version, release, arch, _none(license_) or "unknown", _none(summary) or name,
                     _none(sections[1]), tuple(dependencies), tuple(scriptlets), tuple(files))


def parse_verify(text: str) -> Tuple[List[str], List[str], List[str]]:
    """``rpm -V`` output as (changed, missing, config files edited); mode, owner and mtime alone are no change of
    content (the rebuilt file takes the header's modes and owners)."""
    changed: List[str] = []
    missing: List[str] = []
    edited: List[str] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        path = parts[-1]
        is_config = len(parts) >= 3 and parts[-2] == "c"
        if parts[0] == "missing":
            missing.append(path)
        elif "5" in parts[0] or "S" in parts[0] or "L" in parts[0]:
            (edited if is_config else changed).append(path)
    return changed, missing, edited


def _escape(text: str) -> str:
    """Spec text with rpm's macro character escaped."""
    return text.replace("%", "%%")


def render_spec(header: RpmHeader, files: Sequence[RpmFile]) -> str:
    """A spec that packs ``files`` (staged in the buildroot) with ``header``'s metadata."""
    lines = [f"Name: {header.name}", f"Version: {header.version}", f"Release: {header.release}",
             f"Summary: {_escape(header.summary)}", f"License: {_escape(header.license)}", "AutoReqProv: no"]
    if header.epoch:
        lines.append(f"Epoch: {header.epoch}")
    if header.arch == "noarch":
        lines.append("BuildArch: noarch")
    lines += [f"{label}: {_escape(dep)}" for label, dep in header.dependencies]
    lines += ["", "%description", _escape(header.description or header.summary), ""]
    for section, prog, body in header.scriptlets:
        lines += [f"%{section} -p {prog}", _escape(body), ""]
    lines += ["%files", "%defattr(-,root,root,-)"]
    for f in files:
        marks = []
        if "g" in f.flags:
            marks.append("%ghost")
        if "c" in f.flags:
            marks.append("%config(noreplace)" if "n" in f.flags else "%config")
        if os.path.isabs(f.path) and (f.mode & 0o170000) == 0o040000:
            marks.append("%dir")
        attr = f"%attr({f.mode & 0o7777:04o},{f.user},{f.group})"
        quoted = '"' + _escape(f.path).replace('"', '\\"') + '"'
        lines.append(" ".join([*marks, attr, quoted]))
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class RebuiltRpm:
    path: str
    changed: Tuple[str, ...] = ()
    missing: Tuple[str, ...] = ()
    conffiles_edited: Tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        return not (self.changed or self.missing)

    def differences(self) -> List[str]:
        return ([f"changed since installation: {p}" for p in self.changed]
                + [f"missing since installation: {p}" for p in self.missing])


class RpmRebuilder:
    """Rebuilds installed packages of one Host into ``.rpm`` files with rpmbuild."""

    def __init__(self, host: Host, rpm_argv_prefix: Sequence[str], timeout_seconds: float = 900.0) -> None:
        self.host = host
        self.rpm = list(rpm_argv_prefix)  # ["rpm", "--root", ROOT]
        self.timeout_seconds = timeout_seconds

    def rebuild(self, nevra: str, target: str) -> Optional[RebuiltRpm]:
        """Write the installed ``nevra`` to ``target`` (a host path); None when rpm does not have it installed.
        CommandError when rpmbuild fails, ValueError when rpm's answer cannot be read."""
        queried = self.host.run([*self.rpm, "-q", "--qf", query_format(), nevra], timeout_seconds=120.0)
        if queried.returncode != 0:
            return None
        header = parse_query(queried.stdout)
        verified = self.host.run([*self.rpm, "-V", "--nodeps", "--nomtime", nevra], timeout_seconds=600.0)
        changed, missing, edited = parse_verify(verified.stdout)
        real = self.host.path(target)
        work = real.parent / f".rebuild-{real.name}"
        shutil.rmtree(work, ignore_errors=True)
        stage = work / "stage"
        try:
            packed = self._stage(header, stage, set(missing))
            (work / "top").mkdir(parents=True)
            spec = work / "rebuild.spec"
            spec.write_text(render_spec(header, packed), encoding="utf-8")
            argv = ["rpmbuild", "-bb", "--quiet", "--target", header.arch, "--buildroot", str(stage),
                    "--define", f"_topdir {work / 'top'}", "--define", f"_rpmdir {real.parent}",
                    "--define", f"_build_name_fmt {real.name}.partial"]
            for define in RPMBUILD_DEFINES:
                argv += ["--define", define]
            self.host.run([*argv, str(spec)], timeout_seconds=self.timeout_seconds).check()
            os.replace(real.parent / f"{real.name}.partial", real)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            (real.parent / f"{real.name}.partial").unlink(missing_ok=True)
        return RebuiltRpm(target, tuple(changed), tuple(missing), tuple(edited))

    def _stage(self, header: RpmHeader, stage: "os.PathLike[str]", missing: Set[str]) -> List[RpmFile]:
        """Copy the installed files into ``stage``; the files the spec lists (missing ones left out)."""
        packed = []
        for f in header.files:
            if f.path in missing and "g" not in f.flags:
                continue
            into = os.path.join(stage, f.path.lstrip("/"))
            kind = f.mode & 0o170000
            if "g" in f.flags:
                pass  # a %ghost file is listed, never packed
            elif kind == 0o040000:
                os.makedirs(into, exist_ok=True)
            elif kind == 0o120000:
                os.makedirs(os.path.dirname(into), exist_ok=True)
                os.symlink(f.link_to, into)
            else:
                os.makedirs(os.path.dirname(into), exist_ok=True)
                shutil.copyfile(self.host.path(self.host.resolve(os.path.dirname(f.path)) + "/"
                                               + os.path.basename(f.path)), into)
            packed.append(f)
        return packed

