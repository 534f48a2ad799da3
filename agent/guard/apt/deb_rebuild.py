"""Rebuild the .deb of an installed package from dpkg's database, when no cache or repository has that version.

What dpkg-repack does, in the standard library: the control paragraph from ``/var/lib/dpkg/status`` without the
fields dpkg adds on installation (Status, Config-Version, Conffiles, Triggers-*), the maintainer scripts,
conffiles, triggers, shlibs, symbols, templates and md5sums from ``/var/lib/dpkg/info/PKG[:arch].*``, and the
installed files that ``PKG[:arch].list`` names (regular files, symlinks and directories, with the modes, owners
and modification times they have on disk), written as dpkg-deb writes a package: an ar archive of
``debian-binary``, ``control.tar.gz`` and ``data.tar.gz`` (GNU tar members, ``./``-relative names).

Our own writer rather than ``dpkg-deb --build`` of a staging tree: a staging copy of a CUDA set costs its size
again in disk and, without root, loses the owners; this streams each installed file once into the archive,
takes owners and modes from the file itself, and checks each file against ``PKG.md5sums`` while it reads it.

Every regular file is checked against the md5sum dpkg recorded; a file changed or missing on disk since
installation makes the rebuilt package inexact (the paths are returned and kept with the file). A conffile the
operator edited is not a difference of the package: the edit is carried as is (dpkg keeps the file on disk
either way), and reported. Files another package diverted away are read from where the diversion put them.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import time
from dataclasses import dataclass, field
from typing import IO, Dict, List, Optional, Tuple

from agent.errors import InputFileError
from agent.host import Host

DPKG_INFO = "/var/lib/dpkg/info"
DPKG_STATUS = "/var/lib/dpkg/status"
DPKG_DIVERSIONS = "/var/lib/dpkg/diversions"
# Fields dpkg writes into the status file on installation, never part of a package's control file.
INSTALL_ONLY_FIELDS = frozenset({"status", "config-version", "conffiles", "triggers-awaited", "triggers-pending"})
SCRIPTS = ("preinst", "postinst", "prerm", "postrm", "config")
CONTROL_FILES = ("conffiles", "triggers", "shlibs", "symbols", "templates", "md5sums")
_CHUNK_BYTES = 1 << 20
# data.tar.gz at gzip level 1: on a ROCm-like stack level 6 took twice the time for 4 % fewer bytes (issue #45);
# every dpkg reads it. control.tar.gz is a few KiB and keeps level 6.
DATA_GZIP_LEVEL = 1


@dataclass(frozen=True)
class RebuiltDeb:
    """What a rebuild wrote: the file, and how far it is the package dpkg installed."""

    path: str  # host path of the .deb
    changed: Tuple[str, ...] = ()  # packaged files whose content differs from dpkg's md5sums (inexact)
    missing: Tuple[str, ...] = ()  # packaged files no longer on disk (inexact)
    unverified: bool = False  # the package has no md5sums: its files could not be checked (inexact)
    conffiles_edited: Tuple[str, ...] = ()  # conffiles the operator changed: carried as edited
    size_bytes: int = 0

    @property
    def exact(self) -> bool:
        return not (self.changed or self.missing or self.unverified)

    def differences(self) -> List[str]:
        """Why the package is inexact, one phrase per kind of difference."""
        out = [f"changed since installation: {p}" for p in self.changed]
        out += [f"missing since installation: {p}" for p in self.missing]
        if self.unverified:
            out.append("no md5sums recorded: the files could not be verified")
        return out


@dataclass
class _Stanza:
    control: str
    conffiles: Dict[str, str] = field(default_factory=dict)  # path -> md5 dpkg recorded (obsolete ones left out)


def find_stanza(status_text: str, name: str, arch: str, version: str) -> Optional[str]:
    """The status stanza of ``name`` installed for ``arch`` at ``version``; None when dpkg has no such package."""
    for stanza in status_text.split("\n\n"):
        fields = _top_fields(stanza)
        if (fields.get("package") == name and fields.get("version") == version
                and fields.get("architecture", "") in (arch, "") and fields.get("status", "").endswith(" installed")):
            return stanza.strip("\n")
    return None


def installed_size_bytes(stanza: str) -> int:
    """The stanza's ``Installed-Size`` (KiB) in bytes; 0 when it has none or it is not a number."""
    value = _top_fields(stanza).get("installed-size", "")
    return int(value) * 1024 if value.isdigit() else 0


def _top_fields(stanza: str) -> Dict[str, str]:
    out = {}
    for line in stanza.splitlines():
        if line and not line[0].isspace() and ":" in line:
            key, _, value = line.partition(":")
            out[key.strip().lower()] = value.strip()
    return out


def control_paragraph(stanza: str) -> _Stanza:
    """The package's control file from its status stanza, and its conffiles' recorded md5sums."""
    kept: List[str] = []
    conffiles: Dict[str, str] = {}
    current = ""
    for line in stanza.splitlines():
        if line and not line[0].isspace():
            current = line.partition(":")[0].strip().lower()
            if current not in INSTALL_ONLY_FIELDS:
                kept.append(line)
        elif current == "conffiles":
            parts = line.split()
            if len(parts) >= 2 and "obsolete" not in parts[2:] and "remove-on-upgrade" not in parts[2:]:
                conffiles[parts[0]] = parts[1]
        elif current not in INSTALL_ONLY_FIELDS:
            kept.append(line)
    return _Stanza("\n".join(kept) + "\n", conffiles)


def parse_md5sums(text: str) -> Dict[str, str]:
    """``/path`` -> md5 from a ``PKG.md5sums`` file (``md5  relative/path`` lines)."""
    out = {}
    for line in text.splitlines():
        digest, _, path = line.partition(" ")
        path = path.lstrip(" *")
        if len(digest) == 32 and path:
            out["/" + path.lstrip("/")] = digest.lower()
    return out


def parse_diversions(text: str) -> Dict[str, Tuple[str, str]]:
    """From ``/var/lib/dpkg/diversions`` (triples of lines): path -> (where it was diverted to, by which package)."""
    lines = text.splitlines()
    return {lines[i]: (lines[i + 1], lines[i + 2]) for i in range(0, len(lines) - 2, 3)}


def ar_header(name: str, size: int, mtime: int, mode: int = 0o100644) -> bytes:
    """One 60-byte ar member header, as dpkg-deb writes it (GNU-style ``name/``, uid and gid 0)."""
    header = (f"{name + '/':<16}{mtime:<12}{0:<6}{0:<6}{mode:<8o}{size:<10}`\n").encode("ascii")
    if len(header) != 60:
        raise ValueError(f"ar member {name!r} does not fit a header")
    return header


def _info_prefix(host: Host, name: str, arch: str) -> str:
    qualified = f"{DPKG_INFO}/{name}:{arch}"
    return qualified if host.path(qualified + ".list").is_file() else f"{DPKG_INFO}/{name}"


class _DigestReader(io.RawIOBase):
    """A file read into the archive and hashed on the way (one read of each installed file)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.md5 = hashlib.md5(usedforsecurity=False)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: "bytearray | memoryview") -> int:  # type: ignore[override]
        data = self.stream.read(len(buffer))
        self.md5.update(data)
        buffer[:len(data)] = data
        return len(data)


def _tar_info(member: str, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(member)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.uname = info.gname = ""  # numeric owners: the same host unpacks it
    info.mtime = int(st.st_mtime)
    return info


class DebRebuilder:
    """Rebuilds installed packages of one Host into ``.deb`` files."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def rebuild(self, name: str, version: str, arch: str, target: str) -> Optional[RebuiltDeb]:
        """Write the installed ``name`` (``arch``) at ``version`` to ``target`` (a host path); None when dpkg does
        not have exactly that version installed. InputFileError when its database entries cannot be read."""
        status_text = self.host.read_text(DPKG_STATUS) or ""
        stanza = find_stanza(status_text, name, arch, version)
        if stanza is None:
            return None
        control = control_paragraph(stanza)
        prefix = _info_prefix(self.host, name, arch)
        listed = self.host.read_text(prefix + ".list")
        if listed is None:
            raise InputFileError(str(self.host.path(prefix + ".list")), "dpkg lists no files for this package")
        md5sums_text = self.host.read_text(prefix + ".md5sums")
        md5sums = parse_md5sums(md5sums_text or "")
        diversions = parse_diversions(self.host.read_text(DPKG_DIVERSIONS) or "")
        real = self.host.path(target)
        real.parent.mkdir(parents=True, exist_ok=True)
        partial = real.with_name(real.name + ".partial")
        data_tmp = real.with_name(real.name + ".data.partial")
        try:
            with open(data_tmp, "wb") as raw:
                outcome = self._write_data(raw, name, [p for p in listed.splitlines() if p], md5sums,
                                           control.conffiles, diversions)
            control_tar = self._control_tar(prefix, control.control, md5sums_text)
            now = int(time.time())
            with open(partial, "wb") as out:
                out.write(b"!<arch>\n")
                for member, payload in (("debian-binary", b"2.0\n"), ("control.tar.gz", control_tar)):
                    out.write(ar_header(member, len(payload), now))
                    out.write(payload + (b"\n" if len(payload) % 2 else b""))
                data_size = os.path.getsize(data_tmp)
                out.write(ar_header("data.tar.gz", data_size, now))
                with open(data_tmp, "rb") as data:
                    while chunk := data.read(_CHUNK_BYTES):
                        out.write(chunk)
                if data_size % 2:
                    out.write(b"\n")
            os.replace(partial, real)
        finally:
            for leftover in (partial, data_tmp):
                leftover.unlink(missing_ok=True)
        changed, missing, edited = outcome
        return RebuiltDeb(target, tuple(changed), tuple(missing), unverified=md5sums_text is None,
                          conffiles_edited=tuple(edited), size_bytes=real.stat().st_size)

    def _control_tar(self, prefix: str, control: str, md5sums_text: Optional[str]) -> bytes:
        buffer = io.BytesIO()
        with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped, \
                tarfile.open(fileobj=zipped, mode="w", format=tarfile.GNU_FORMAT) as tar:
            root = tarfile.TarInfo("./")
            root.type, root.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(root)
            members: List[Tuple[str, bytes, int]] = [("control", control.encode("utf-8"), 0o644)]
            for script in SCRIPTS:
                content = self.host.read_bytes(f"{prefix}.{script}")
                if content is not None:
                    members.append((script, content, 0o755))
            for extra in CONTROL_FILES:
                content = md5sums_text.encode("utf-8") if extra == "md5sums" and md5sums_text is not None \
                    else self.host.read_bytes(f"{prefix}.{extra}") if extra != "md5sums" else None
                if content is not None:
                    members.append((extra, content, 0o644))
            for member, content, mode in members:
                info = tarfile.TarInfo(f"./{member}")
                info.size, info.mode = len(content), mode
                tar.addfile(info, io.BytesIO(content))
        return buffer.getvalue()

    def _location(self, path: str, package: str, diversions: Dict[str, Tuple[str, str]]) -> str:
        """Where the package's ``path`` is on disk: inside the root, parents resolved, a foreign diversion followed."""
        diverted = diversions.get(path)
        if diverted is not None and diverted[1] != package:
            path = diverted[0]
        parent, _, base = path.rpartition("/")
        resolved_parent = self.host.resolve(parent) if parent else ""
        return f"{resolved_parent.rstrip('/')}/{base}"

    def _write_data(self, raw: IO[bytes], package: str, listed: List[str], md5sums: Dict[str, str],
                    conffiles: Dict[str, str], diversions: Dict[str, Tuple[str, str]]
                    ) -> Tuple[List[str], List[str], List[str]]:
        changed: List[str] = []
        missing: List[str] = []
        edited: List[str] = []
        prefixes = {p.rsplit("/", 1)[0] for p in listed}
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=DATA_GZIP_LEVEL) as zipped, \
                tarfile.open(fileobj=zipped, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for path in listed:
                if path == "/.":
                    root = tarfile.TarInfo("./")
                    root.type, root.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(root)
                    continue
                member = "." + path
                where = self.host.path(self._location(path, package, diversions))
                try:
                    st = os.lstat(where)
                    if stat.S_ISLNK(st.st_mode) and path in prefixes:
                        # A directory the package shipped that is a symlink here (merged /usr: /lib -> usr/lib):
                        # dpkg follows it, so it stays a directory in the package.
                        st = os.stat(self.host.path(self.host.resolve(path)))
                except FileNotFoundError:
                    missing.append(path)
                    continue
                info = _tar_info(member + ("/" if stat.S_ISDIR(st.st_mode) else ""), st)
                if stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif stat.S_ISLNK(st.st_mode):
                    info.type, info.linkname = tarfile.SYMTYPE, os.readlink(where)
                    tar.addfile(info)
                elif stat.S_ISREG(st.st_mode):
                    info.size = st.st_size
                    with open(where, "rb") as stream:
                        reader = _DigestReader(stream)
                        tar.addfile(info, io.BufferedReader(reader, _CHUNK_BYTES))
                    digest = reader.md5.hexdigest()
                    if path in conffiles:
                        if conffiles[path] != digest:
                            edited.append(path)
                    elif path in md5sums and md5sums[path] != digest:
                        changed.append(path)
                else:
                    # a device node or fifo: packages never ship those under dpkg's rules; keep it as listed
                    info.type = tarfile.CHRTYPE if stat.S_ISCHR(st.st_mode) else tarfile.FIFOTYPE
                    tar.addfile(info)
        return changed, missing, edited
