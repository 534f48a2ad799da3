"""OS identity from /etc/os-release (fallback /usr/lib/os-release)."""

from __future__ import annotations

from typing import List, Optional

from agent.errors import CollectorUnavailable
from agent.frozen import Frozen, field, frozen_record
from agent.host import Host
from agent.hostfacts.keyvalue import parse_key_value_lines


@frozen_record
class OsRelease(Frozen):
    """The fields of os-release(5) that matter for support matrices."""

    id: str
    id_like: List[str] = field(default_factory=list)
    version_id: Optional[str] = None
    version_codename: Optional[str] = None
    pretty_name: Optional[str] = None

    @property
    def family(self) -> str:
        """``debian`` or ``rhel`` or ``suse`` or the plain id."""
        ids = [self.id, *self.id_like]
        for family, members in (("debian", {"debian", "ubuntu"}), ("rhel", {"rhel", "fedora", "centos"}),
                                ("suse", {"suse", "sles", "opensuse"})):
            if any(i in members for i in ids):
                return family
        return self.id


def parse_os_release(text: str) -> OsRelease:
    """Parse os-release text; ID defaults to ``linux`` as os-release(5) says."""
    fields = parse_key_value_lines(text)
    return OsRelease(
        id=fields.get("ID", "linux").lower(),
        id_like=fields.get("ID_LIKE", "").lower().split(),
        version_id=fields.get("VERSION_ID") or None,
        version_codename=fields.get("VERSION_CODENAME") or None,
        pretty_name=fields.get("PRETTY_NAME") or None,
    )


class OsReleaseCollector:
    """Reads os-release."""

    name = "os"

    def collect(self, host: Host) -> OsRelease:
        for path in ("/etc/os-release", "/usr/lib/os-release"):
            text = host.read_text(path)
            if text is not None:
                return parse_os_release(text)
        raise CollectorUnavailable("no /etc/os-release or /usr/lib/os-release")
