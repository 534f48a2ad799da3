"""The set-up the deny-list tests under real apt (a chroot) and real dnf (an installroot) share: the managed root
trusting tests/bundle's root version 1, its local policy in force, reporting to a real hub whose roots directory
will hold the deny list (its entries: tests/bundle/test_deny.py)."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Union

from tests.bundle.test_attacks import Fleet
from tests.bundle.test_roles import Trust
from tests.guard.apt.chroot.harness import Chroot
from tests.guard.apt.chroot.test_bundle import ChrootSite
from tests.guard.dnf.installroot.harness import Installroot


@contextmanager
def deny_fleet(tmp_path: Path, managed: Union[Chroot, Installroot]) -> Iterator[Fleet]:
    """MANAGED (its root and state_dir) trusting root version 1 with its local policy in force, reporting to a real
    hub; on leaving, the hub stops and the trusted keys go (the root's own fixture resets the rest)."""
    for name in ("trust", "site", "hub"):
        (tmp_path / name).mkdir()
    trust = Trust(tmp_path / "trust", place_first_root=False)
    site = ChrootSite(tmp_path / "site", managed)  # type: ignore[arg-type]  # an installroot has the same fields
    site.config.write_text(site.config.read_text().replace('policy_source = "bundle"', 'policy_source = "local"'))
    keys = managed.root / "etc/gpuguard/keys"
    for suffix in ("", ".sig"):
        (keys / f"root.json{suffix}").write_bytes(Path(f"{trust.first}{suffix}").read_bytes())
    trust.site = site
    made = Fleet(tmp_path / "hub", trust)
    try:
        yield made
    finally:
        made.close()
        site.signer.close()
        shutil.rmtree(keys, ignore_errors=True)
