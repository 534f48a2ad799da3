"""Release numbers encoded in package versions: amdgpu driver (both numberings), ROCm, kernels."""

from __future__ import annotations

import pytest

from agent.policy.releases import (
    amdgpu_driver_release,
    amdgpu_kernel_base,
    amdgpu_same_build,
    cuda_release,
    kernel_release_of,
    rocm_release,
    series,
)


@pytest.mark.parametrize("version,release", [
    ("1:6.8.5.60202-2041575.22.04", "6.2.2"),
    ("6.2.4.50701-1664922.22.04", "5.7.1"),
    ("1:6.3.6.60000-1697589.22.04", "6.0.0"),
    ("1:6.14.14.30100000-2204008.24.04", "30.10.0"),
    ("1:6.14.14.30100100-2212064.24.04", "30.10.1"),
    ("1:6.16.13.30300400-2341068.24.04", "30.30.4"),
    ("6.12.12-2187269.el9", None),  # RPM file versions from 6.4.2 on drop the code
    ("", None),
])
def test_amdgpu_driver_release(version: str, release) -> None:
    """amdgpu-dkms versions give their driver release (5.7 to 30.30), and an RPM version without the code none."""
    assert amdgpu_driver_release(version) == release


def test_other_releases() -> None:
    """The DKMS kernel base, the ROCm release of rocm-core and a release's series are read from versions."""
    assert amdgpu_kernel_base("1:6.8.5.60202-2041575.22.04") == "6.8.5"
    assert rocm_release("6.2.2.60202-116~22.04") == "6.2.2"
    assert rocm_release("7.0.1.70001-42~24.04") == "7.0.1"
    assert series("30.20.1") == "30.20" and series("6.2.2") == "6.2"


@pytest.mark.parametrize("name,version,arch,manager,release", [
    ("linux-image-6.1.0-26-amd64", "6.1.112-1", "amd64", "dpkg", "6.1.0-26-amd64"),
    ("linux-image-6.8.0-44-generic", "6.8.0-44.44", "amd64", "dpkg", "6.8.0-44-generic"),
    ("linux-image-unsigned-6.8.0-44-generic", "6.8.0-44.44", "amd64", "dpkg", "6.8.0-44-generic"),
    ("linux-modules-6.8.0-44-generic", "6.8.0-44.44", "amd64", "dpkg", "6.8.0-44-generic"),
    ("linux-image-amd64", "6.1.112-1", "amd64", "dpkg", None),
    ("linux-image-6.1.0-26-amd64-dbg", "6.1.112-1", "amd64", "dpkg", None),
    ("kernel-core", "5.14.0-427.el9", "x86_64", "rpm", "5.14.0-427.el9.x86_64"),
    ("kernel-core@5.14.0-427.el9", "5.14.0-427.el9", "", "rpm", "5.14.0-427.el9"),
    ("kernel-tools", "5.14.0-427.el9", "x86_64", "rpm", None),
])
def test_kernel_release_of(name, version, arch, manager, release) -> None:
    """Kernel packages give the uname -r they install (dpkg and rpm), and meta or debug packages none."""
    assert kernel_release_of(name, version, arch, manager) == release


@pytest.mark.parametrize("driver,firmware,same", [
    ("1:6.8.5.60202-2041575.24.04", "1:6.8.5.60202-2041575.24.04", True),
    ("1:7.1.9.31600000-2403767.26.04", "1:31.60.0.0.31600000-2403767.26.04", True),  # 31.60 as seen on a host
    ("1:7.1.9.31600000-2403767.26.04", "1:31.60.0.0.31600000-2410000.26.04", False),  # another build
    ("1:7.1.9.31600000-2403767.26.04", "1:31.50.0.0.31500000-2403767.26.04", False),  # another release
    ("1:6.8.5.60202-2041575.24.04", "1:6.8.5.60204-2041575.24.04", False),  # before 31.x: equal versions only
])
def test_amdgpu_same_build(driver: str, firmware: str, same: bool) -> None:
    """The driver and its firmware are one build when equal or, in the 31.x numbering, of one code and build."""
    assert amdgpu_same_build(driver, firmware) is same


@pytest.mark.parametrize("version,release", [
    ("12.4.127~12.4.1-2", "12.4.1"),  # Debian 13 libcudart12
    ("11.2.1.3~12.4.1-8.2+b1", "12.4.1"),  # sid libcufft11: its own number first, the CUDA release after ~
    ("12.4.131~12.4.1-2", "12.4.1"),  # nvidia-cuda-toolkit
    ("13.0.96-1", "13.0.96"),  # NVIDIA's cuda-cudart-13-0
    ("13.0.0~rc1-1", "13.0.0"),  # a pre-release tilde is not a release
    ("1:12.0.1~12.0.1-1", "12.0.1"),
    ("", None),
])
def test_cuda_release(version: str, release) -> None:
    """Debian's CUDA packages carry the release after a tilde; NVIDIA's lead with it."""
    assert cuda_release(version) == release
