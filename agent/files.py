"""Atomic file writes, bounded reads and moving damaged files aside, shared by every room (stdlib only)."""

from __future__ import annotations

import errno
import os
import stat

from agent.errors import InputFileError, StateWriteError
from agent.hostfacts.paths import open_regular, read_regular_file
from agent.strictjson import MAX_NESTING_DEPTH, parse_json_text

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import IO, Any, Mapping, Optional, Tuple


def write_atomically(path: str, text: str, mode: int = 0o644, fsync: bool = True) -> None:
    """Write text so that readers see the old or the new file, never half of one (fsync + rename).

    StateWriteError (an OSError too) when it cannot: a full disk, a read-only or missing directory; the old file is
    then kept as it was and no temporary file is left behind.

    The temporary file is a dot-file in the same directory (``.<name>.<random>``): readers that skip dot-files or
    match a suffix (NFD's features.d, node_exporter's ``*.prom``) never read it. ``fsync=False`` for files that are
    rewritten within a job interval anyway, where only atomicity matters.
    """
    _replace_atomically(path, text.encode("utf-8"), mode, fsync, make_directory=True)


def write_bytes_atomically(path: str, data: bytes, mode: int = 0o600) -> None:
    """:func:`write_atomically` for bytes (a keyring, a detached signature): the old or the new file, never half;
    the directory must exist."""
    _replace_atomically(path, data, mode, True, make_directory=False)


def _replace_atomically(path: str, data: bytes, mode: int, fsync: bool, make_directory: bool) -> None:
    """``data`` written to a dot-file beside ``path`` (its directory made first when ``make_directory``), then
    renamed over it; StateWriteError for an OSError, the temporary file removed."""
    directory = os.path.dirname(str(path)) or "."
    tmp = None
    try:
        if make_directory:
            os.makedirs(directory, exist_ok=True)
        fd, tmp = create_exclusive(directory, "." + os.path.basename(str(path)) + ".")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # a full disk (often only at the close's flush): the old file stays whole
            raise StateWriteError.of(str(path), exc) from None
        raise


# tempfile's mkstemp and mkdtemp without tempfile, which brings shutil with bz2 and lzma: 0.7 MiB that would stay in
# the resident daemon for its metrics file and one directory at start (issue #28). The same guarantees: O_EXCL and
# O_NOFOLLOW, mode 0600 (0700 for a directory), a random name, tried again when taken.
_ATTEMPTS = 100
# Where tempfile.gettempdir looks, in its order (the working directory aside).
_TEMPORARY_VARIABLES = ("TMPDIR", "TEMP", "TMP")
_TEMPORARY_DIRECTORIES = ("/tmp", "/var/tmp", "/usr/tmp")


def create_exclusive(directory: str, prefix: str) -> "Tuple[int, str]":
    """A new file ``directory/prefix<random>`` only this user can read, opened for writing: (fd, path)."""
    for _ in range(_ATTEMPTS):
        path = os.path.join(directory, prefix + os.urandom(6).hex())
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary file name", directory)


def make_private_directory(prefix: str, environ: "Optional[Mapping[str, str]]" = None) -> str:
    """A new directory ``prefix<random>`` (mode 0700) where tempfile.mkdtemp would make it: $TMPDIR, $TEMP, $TMP,
    /tmp, /var/tmp, /usr/tmp, the first that takes it."""
    env = os.environ if environ is None else environ
    bases = [env[name] for name in _TEMPORARY_VARIABLES if env.get(name)] + list(_TEMPORARY_DIRECTORIES)
    for base in bases:
        for _ in range(_ATTEMPTS):
            path = os.path.join(base, prefix + os.urandom(6).hex())
            try:
                os.mkdir(path, 0o700)
                return path
            except FileExistsError:
                continue
            except OSError:
                break  # missing or not writable: the next place
    raise FileNotFoundError(errno.ENOENT, f"no usable temporary directory found in {bases}")


def remove_flat_directory(path: str) -> None:
    """Remove a directory and the files in it (a child's result, a write it did not finish); never raises."""
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass
        os.rmdir(path)
    except OSError:
        pass


# Bounds for every state and config file: none of ours comes near them; a file past them is damaged or hostile.
MAX_FILE_BYTES = 64 << 20


def decode_text(path: str, raw: bytes) -> str:
    """UTF-8 text of a file's bytes; InputFileError names the file and the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(path, f"not UTF-8 text (byte {exc.start})") from None


class FileMissing(InputFileError):
    """The path does not exist (FileNotFoundError); callers that default on a missing file catch this one only."""


def read_bytes_bounded(path: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """A file's bytes; FileMissing when there is none, InputFileError for one unreadable, not a regular file (a
    FIFO never blocks the reader) or over ``max_bytes`` (agent.hostfacts.paths.read_regular_file underneath)."""
    try:
        return read_regular_file(path, max_bytes)
    except FileNotFoundError:
        raise FileMissing(path, "no such file") from None
    except OSError as exc:
        raise InputFileError(path, exc.strerror or str(exc)) from None


def open_regular_file(path: str, nofollow: bool = False) -> "IO[bytes]":
    """The regular file at ``path`` opened to read as a binary stream, never blocking on what is in its place.

    For the readers that stream or seek (the daemon's guard-events forwarder); the others read whole files with
    :func:`read_bytes_bounded`. OSError as agent.hostfacts.paths.open_regular raises it: FileNotFoundError when
    there is none, EINVAL ("not a regular file") for a FIFO, socket, device or directory, ELOOP for a link with
    ``nofollow``.
    """
    fd, _ = open_regular(path, nofollow)
    return os.fdopen(fd, "rb")


def open_append_regular(path: str, mode: int = 0o640) -> int:
    """A write-only, append-only descriptor of the regular file at ``path`` (created with ``mode`` when missing).

    O_NONBLOCK (a FIFO put in place of the file fails or opens at once instead of waiting for a reader), O_NOFOLLOW
    (ELOOP for a symbolic link), O_NOCTTY; then fstat: OSError(EINVAL, "not a regular file") for anything else, the
    descriptor closed. The appending twin of agent.hostfacts.paths.open_regular.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY
                 | os.O_CLOEXEC, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_json_file(path: str, missing_reason: "Optional[str]" = None, max_bytes: int = MAX_FILE_BYTES,
                   max_depth: int = MAX_NESTING_DEPTH) -> "Any":
    """Parse a JSON file; InputFileError names the file for unreadable, oversized, non-UTF-8 or invalid JSON.

    A missing file gives None, or InputFileError(missing_reason) when a reason is given (the file is required).
    Invalid includes NaN/Infinity, numbers that overflow to infinity and nesting deeper than ``max_depth``.
    """
    try:
        raw = read_bytes_bounded(path, max_bytes)
    except FileMissing:
        if missing_reason is None:
            return None
        raise InputFileError(path, missing_reason) from None
    return parse_json_text(path, decode_text(path, raw), max_depth)


def move_aside(path: str, clock: "Optional[Any]" = None) -> "Optional[str]":
    """Rename a damaged file to ``<path>.damaged-<unix seconds>[-n]`` (kept for inspection); its new name or None.

    None when the file is gone already or cannot be renamed (read-only directory): the caller carries on anyway.
    """
    import time

    stamp = int((clock or time.time)())
    for attempt in range(100):
        target = f"{path}.damaged-{stamp}" + (f"-{attempt}" if attempt else "")
        if os.path.lexists(target):
            continue
        try:
            os.rename(path, target)
        except OSError:
            return None
        return target
    return None
