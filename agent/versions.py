"""Package version ordering exactly as dpkg and rpm define it (epochs, revisions, ``~`` and ``^``).

``compare_dpkg`` follows dpkg's ``verrevcmp`` (lib/dpkg/version.c); ``compare_rpm`` follows rpm's ``rpmvercmp``
(rpmio/rpmvercmp.c) plus epoch and release handling of ``rpmVersionCompare``. Both return -1, 0 or 1.
Standard library only and no ``re``: the apt hook imports this module on every apt run.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget, which imports this module
    from typing import Any, Callable, Dict, Literal, Optional, Tuple

    Scheme = Literal["dpkg", "rpm"]


def parse_dpkg(version: str) -> Tuple[int, str, str]:
    """Split ``[epoch:]upstream[-revision]`` into (epoch, upstream, revision); ValueError on an epoch that is not a
    number."""
    text = version.strip()
    epoch = 0
    if ":" in text:
        head, _, text = text.partition(":")
        if not head.isdigit():
            raise ValueError(f"invalid epoch in version {version!r}")
        epoch = int(head)
    upstream, sep, revision = text.rpartition("-")
    if not sep:
        upstream, revision = text, ""
    if not upstream:
        raise ValueError(f"empty upstream version in {version!r}")
    return epoch, upstream, revision


def _dpkg_order(ch: str) -> int:
    if ch == "":
        return 0
    if ch.isdigit():
        return 0
    if ch.isalpha() and ch.isascii():
        return ord(ch)
    if ch == "~":
        return -1
    return ord(ch) + 256


def _verrevcmp(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _dpkg_order(a[i] if i < len(a) else "")
            bc = _dpkg_order(b[j] if j < len(b) else "")
            if ac != bc:
                return ac - bc
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def _sign(n: int) -> int:
    return (n > 0) - (n < 0)


_CACHE_SIZE = 4096
_DPKG_ORDER: Dict[Tuple[str, str], int] = {}
_RPM_ORDER: Dict[Tuple[str, str], int] = {}


def compare_dpkg(a: str, b: str) -> int:
    """Order two Debian versions like ``dpkg --compare-versions`` (remembered: evaluation repeats pairs)."""
    rc = _DPKG_ORDER.get((a, b))
    if rc is None:
        if len(_DPKG_ORDER) >= _CACHE_SIZE:
            _DPKG_ORDER.clear()
        rc = _DPKG_ORDER[(a, b)] = _compare_dpkg(a, b)
    return rc


def _compare_dpkg(a: str, b: str) -> int:
    (epoch_a, upstream_a, revision_a), (epoch_b, upstream_b, revision_b) = parse_dpkg(a), parse_dpkg(b)
    if epoch_a != epoch_b:
        return _sign(epoch_a - epoch_b)
    rc = _verrevcmp(upstream_a, upstream_b)
    if rc:
        return _sign(rc)
    return _sign(_verrevcmp(revision_a, revision_b))


def parse_rpm(evr: str) -> Tuple[int, str, str]:
    """Split ``[epoch:]version[-release]`` into (epoch, version, release)."""
    text = evr.strip()
    epoch = 0
    head, sep, rest = text.partition(":")
    if sep and head.isdigit():
        epoch, text = int(head), rest
    version, sep, release = text.rpartition("-")
    if not sep:
        version, release = text, ""
    if not version:
        raise ValueError(f"empty version in {evr!r}")
    return epoch, version, release


_ASCII_ALNUM = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def rpmvercmp(a: str, b: str) -> int:
    """rpm's segment-wise comparison of one version or release string."""
    if a == b:
        return 0
    i = j = 0
    while i < len(a) or j < len(b):
        while i < len(a) and a[i] not in _ASCII_ALNUM and a[i] not in "~^":
            i += 1
        while j < len(b) and b[j] not in _ASCII_ALNUM and b[j] not in "~^":
            j += 1
        ca = a[i] if i < len(a) else ""
        cb = b[j] if j < len(b) else ""
        if ca == "~" or cb == "~":
            if ca != "~":
                return 1
            if cb != "~":
                return -1
            i += 1
            j += 1
            continue
        if ca == "^" or cb == "^":
            if not ca:
                return -1
            if not cb:
                return 1
            if ca != "^":
                return 1
            if cb != "^":
                return -1
            i += 1
            j += 1
            continue
        if not (ca and cb):
            break
        si, sj = i, j
        if ca.isdigit():
            while i < len(a) and a[i].isdigit():
                i += 1
            while j < len(b) and b[j].isdigit():
                j += 1
            isnum = True
        else:
            while i < len(a) and a[i].isascii() and a[i].isalpha():
                i += 1
            while j < len(b) and b[j].isascii() and b[j].isalpha():
                j += 1
            isnum = False
        seg_a, seg_b = a[si:i], b[sj:j]
        if not seg_b:
            return 1 if isnum else -1
        if isnum:
            seg_a, seg_b = seg_a.lstrip("0"), seg_b.lstrip("0")
            if len(seg_a) != len(seg_b):
                return 1 if len(seg_a) > len(seg_b) else -1
        if seg_a != seg_b:
            return 1 if seg_a > seg_b else -1
    ra, rb = a[i:], b[j:]
    if not ra and not rb:
        return 0
    return -1 if not ra else 1


def compare_rpm(a: str, b: str) -> int:
    """Order two rpm ``[epoch:]version-release`` strings like rpm does (missing epoch is 0; remembered)."""
    rc = _RPM_ORDER.get((a, b))
    if rc is None:
        if len(_RPM_ORDER) >= _CACHE_SIZE:
            _RPM_ORDER.clear()
        rc = _RPM_ORDER[(a, b)] = _compare_rpm(a, b)
    return rc


def _compare_rpm(a: str, b: str) -> int:
    (epoch_a, version_a, release_a), (epoch_b, version_b, release_b) = parse_rpm(a), parse_rpm(b)
    if epoch_a != epoch_b:
        return _sign(epoch_a - epoch_b)
    rc = rpmvercmp(version_a, version_b)
    if rc or not (release_a and release_b):
        return rc
    return rpmvercmp(release_a, release_b)


def compare(a: str, b: str, scheme: Scheme) -> int:
    """Order two versions under the given package manager's rules."""
    return compare_dpkg(a, b) if scheme == "dpkg" else compare_rpm(a, b)


def sort_key(scheme: Scheme) -> Callable[[str], Any]:
    """A ``key=`` function for sorting version strings under a scheme."""
    import functools

    return functools.cmp_to_key(lambda x, y: compare(x, y, scheme))


def _first_dotted(text: str) -> Optional[str]:
    """The leftmost run of decimal digits joined by single dots, at least two numbers (``6.8.5.60202``)."""
    i, n = 0, len(text)
    while i < n:
        if not text[i].isdecimal():
            i += 1
            continue
        start = i
        while i < n and text[i].isdecimal():
            i += 1
        end = i
        while end + 1 < n and text[end] == "." and text[end + 1].isdecimal():
            end += 2
            while end < n and text[end].isdecimal():
                end += 1
        if end > i:
            return text[start:end]
    return None


def upstream_dotted(version: str, parts: Optional[int] = None) -> Optional[str]:
    """The first dotted number in a package version's upstream part (``1:6.8.5.60202-1`` -> ``6.8.5.60202``).

    With ``parts``, only that many leading components are kept (``parts=3`` -> ``6.8.5``).
    """
    text = version.split(":", 1)[1] if ":" in version.split("-", 1)[0] else version
    dotted = _first_dotted(text)
    if not dotted:
        return None
    pieces = dotted.split(".")
    return ".".join(pieces[:parts] if parts else pieces)


def compare_release(a: str, b: str) -> int:
    """Order two release strings (``6.1.0-27-amd64``, ``30.20.1``) with dpkg's character rules over the whole
    string: no epoch or revision split, so a kernel release's ``-27-amd64`` compares as digits and letters."""
    return _sign(_verrevcmp(a, b))


# --- validity: the versions dpkg and rpm themselves accept ------------------------------------------------------

_C_SPACE = " \t\n\v\f\r"
_DPKG_UPSTREAM_CHARS = _ASCII_ALNUM | frozenset(".-+~:")
_DPKG_REVISION_CHARS = _ASCII_ALNUM | frozenset(".+~")
_INT_MAX = 2 ** 31 - 1
_DIGITS = "0123456789"
_PLAIN_CHARS = "".join(sorted(_ASCII_ALNUM)) + ".+~-"


def _is_plain_dpkg(version: str) -> bool:
    """A subset of the valid versions, decided by a few ``str`` calls (the hook's hot loop): an epoch of at
    most 9 digits, then a digit, then letters, digits and ``.+~-`` with no ':' and no '-' at the end."""
    head, colon, body = version.partition(":")
    if not colon:
        body = head
    elif not (0 < len(head) <= 9 and not head.strip(_DIGITS)):
        return False
    return bool(body) and body[0] in _DIGITS and body[-1] != "-" and not body.strip(_PLAIN_CHARS)


def dpkg_version_problem(version: str) -> Optional[str]:
    """What dpkg says is wrong with ``version`` (its parseversion's error or warning text), or None when valid.

    Mirrors lib/dpkg/parsehelp.c: surrounding blanks are dropped; no blank inside; an epoch is a number (as
    strtol reads it) from 0 to INT_MAX with something after the colon; the revision follows the last '-' and is
    not empty; the upstream part is not empty, starts with a digit and holds only ASCII letters, digits and
    ``.-+~:``; the revision only ASCII letters, digits and ``.+~``. dpkg only warns on the last three, but a
    version it warns about is one no archive carries: the guard treats every one of them as invalid.
    """
    if _is_plain_dpkg(version):  # what archives carry
        return None
    text = version.strip(_C_SPACE)
    if not text:
        return "version string is empty"
    if any(ch in _C_SPACE for ch in text):
        return "version string has embedded spaces"
    head, colon, rest = text.partition(":")
    if colon:
        if not head:
            return "epoch in version is empty"
        digits = head[1:] if head[0] in "+-" else head
        if not digits or digits.strip(_DIGITS):  # strtol's optional sign, then ASCII digits only
            return "epoch in version is not number"
        epoch = int(head)
        if epoch < 0:
            return "epoch in version is negative"
        if epoch > _INT_MAX:
            return "epoch in version is too big"
        if not rest:
            return "nothing after colon in version number"
        text = rest
    upstream, hyphen, revision = text.rpartition("-")
    if not hyphen:
        upstream, revision = text, ""
    elif not revision:
        return "revision number is empty"
    if not upstream:
        return "version number is empty"
    if not upstream[0].isascii() or not upstream[0].isdigit():
        return "version number does not start with digit"
    if any(ch not in _DPKG_UPSTREAM_CHARS for ch in upstream):
        return "invalid character in version number"
    if any(ch not in _DPKG_REVISION_CHARS for ch in revision):
        return "invalid character in revision number"
    return None


_RPM_CHARS = _ASCII_ALNUM | frozenset("._+~^")


def rpm_version_problem(evr: str) -> Optional[str]:
    """What is wrong with an rpm ``[epoch:]version[-release]`` (rpmbuild's rules), or None when valid.

    The epoch is digits; version and release are not empty, hold only ASCII letters, digits and ``._+~^``
    (rpmbuild refuses anything else, '-' included: the release follows the last '-') and no ``..``.
    """
    text = evr
    if not text:
        return "version string is empty"
    head, colon, rest = text.partition(":")
    if colon:
        if not head.isascii() or not head.isdigit():
            return f"epoch {head!r} is not a number"
        text = rest
    version, hyphen, release = text.rpartition("-")
    if not hyphen:
        version, release = text, ""
    elif not release:
        return "release is empty after '-'"
    if not version:
        return "version is empty"
    for part, label in ((version, "version"), (release, "release")):
        bad = next((ch for ch in part if ch not in _RPM_CHARS), None)
        if bad is not None:
            return f"invalid character {bad!r} in {label}"
        if ".." in part:
            return f"illegal sequence '..' in {label}"
    return None


def version_problem(version: str, scheme: str) -> Optional[str]:
    """``dpkg_version_problem`` or ``rpm_version_problem`` by scheme (``release`` strings are not checked)."""
    if scheme == "dpkg":
        return dpkg_version_problem(version)
    if scheme == "rpm":
        return rpm_version_problem(version)
    return None
