"""DKMS build state per module and kernel, read from the DKMS tree (/var/lib/dkms) and /lib/modules.

This is the signal for "no GPU module built for the next boot's kernel" (ROCm/ROCm#1663, #3701).
"""

from __future__ import annotations

from typing import List, Literal, Optional

from agent.errors import CollectorUnavailable
from agent.frozen import Frozen, frozen_record
from agent.host import Host

DkmsState = Literal["added", "built", "installed"]
_MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")


@frozen_record
class DkmsModule(Frozen):
    """One module version, and the kernel it was built for (None when only its source is registered)."""

    module: str
    version: str
    state: DkmsState
    kernel: Optional[str] = None
    arch: Optional[str] = None


@frozen_record
class DkmsInfo(Frozen):
    """Every module version DKMS knows, with its per-kernel state."""

    modules: List[DkmsModule]

    def states_for(self, module_prefix: str, kernel: str) -> List[DkmsModule]:
        """The entries of modules starting with ``module_prefix`` built for ``kernel``."""
        return [m for m in self.modules if m.module.startswith(module_prefix) and m.kernel == kernel]


def _installed_in_tree(host: Host, kernel: str, ko_names: List[str]) -> bool:
    for modules_root in ("/lib/modules", "/usr/lib/modules"):
        for sub in ("updates/dkms", "updates", "extra"):
            for ko in ko_names:
                if host.exists(f"{modules_root}/{kernel}/{sub}/{ko}"):
                    return True
    return False


class DkmsCollector:
    """Walks /var/lib/dkms/<module>/<version>/<kernel>/<arch>/module/."""

    name = "dkms"

    def collect(self, host: Host) -> DkmsInfo:
        root = "/var/lib/dkms"
        if not host.is_dir(root):
            raise CollectorUnavailable("no DKMS tree at /var/lib/dkms")
        modules: List[DkmsModule] = []
        for module in host.list_dir(root):
            module_dir = f"{root}/{module}"
            if not host.is_dir(module_dir) or module.startswith("."):
                continue
            for version in host.list_dir(module_dir):
                version_dir = f"{module_dir}/{version}"
                if version in ("original_module", "kernel") or host.read_link(version_dir) is not None \
                        or not host.is_dir(version_dir):
                    continue
                kernels = [k for k in host.list_dir(version_dir) if k not in ("source", "build")
                           and host.is_dir(f"{version_dir}/{k}")]
                if not kernels:
                    modules.append(DkmsModule(module=module, version=version, state="added"))
                for kernel in kernels:
                    for arch in host.list_dir(f"{version_dir}/{kernel}"):
                        built = [n for n in host.list_dir(f"{version_dir}/{kernel}/{arch}/module")
                                 if n.endswith(_MODULE_SUFFIXES)]
                        if not built:
                            continue
                        state: DkmsState = "installed" if _installed_in_tree(host, kernel, built) else "built"
                        modules.append(DkmsModule(module=module, version=version, kernel=kernel, arch=arch,
                                                  state=state))
        if not modules:
            raise CollectorUnavailable("DKMS tree holds no modules")
        return DkmsInfo(modules=modules)
