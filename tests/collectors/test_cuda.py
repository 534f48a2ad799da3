"""Tests for the CUDA toolkit collector."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Optional

import pytest

from agent.collectors.cuda import (
    _CUDA_H_HEAD_CHARS,
    CudaCollector,
    CudaInfo,
    CudaToolkit,
    compat_driver_version,
    cudart_library_release,
    packaged_cuda,
    packaged_release,
    parse_cuda_h_version,
    parse_version_json,
    parse_version_txt,
)
from agent.errors import CollectorUnavailable
from agent.host import Host
from tests.conftest import make_fixture_host
from tests.fakes.runner import FakeRunner

VERSION_JSON_13_0 = '{\n   "cuda" : {\n      "name" : "CUDA SDK",\n      "version" : "13.0.2"\n   },\n' \
                    '   "cuda_nvcc" : {\n      "name" : "CUDA NVCC",\n      "version" : "13.0.88"\n   }\n}\n'


def tree_host(root: Path, files: Dict[str, str], links: Optional[Dict[str, str]] = None) -> Host:
    """A Host over ``root`` with the given files and symlinks (host path -> target, absolute targets kept)."""
    for host_path, text in files.items():
        path = root / host_path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for host_path, target in (links or {}).items():
        path = root / host_path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)
    return Host(root=root, runner=FakeRunner())


@pytest.mark.parametrize("text, expected", [
    (VERSION_JSON_13_0, "13.0.2"),
    ('{"cuda": {"name": "CUDA SDK", "version": "12.6.20241114"}}', "12.6.20241114"),
    ('{"cuda_nvcc": {"version": "12.4.131"}}', None),
    ('{"cuda": {"version": 12}}', None),
    ("[]", None),
])
def test_parse_version_json(text, expected):
    """The SDK version is the "cuda" entry's version, not a component's."""
    assert parse_version_json(text) == expected


def test_parse_version_json_rejects_invalid_json():
    """Text that is not JSON raises ValueError."""
    with pytest.raises(ValueError):
        parse_version_json("CUDA Version 11.8.89")


@pytest.mark.parametrize("text, expected", [
    ("CUDA Version 11.8.89\n", "11.8.89"),
    ("CUDA Version 10.2.89", "10.2.89"),
    ("something else", None),
])
def test_parse_version_txt(text, expected):
    """The legacy version.txt line gives the toolkit version."""
    assert parse_version_txt(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("/**\n * CUDA API version number\n */\n#define CUDA_VERSION 13000\n", "13.0"),
    ("#define CUDA_VERSION 12040\n", "12.4"),
    ("#  define CUDA_VERSION 11080\n", "11.8"),
    ("#define CUDA_VERSION_MAJOR 13\n", None),
    ("", None),
])
def test_parse_cuda_h_version(text, expected):
    """cuda.h's CUDA_VERSION define gives major.minor."""
    assert parse_cuda_h_version(text) == expected


@pytest.mark.parametrize("names, expected", [
    (["libcuda.so", "libcuda.so.1", "libcuda.so.580.95.05", "libnvidia-ptxjitcompiler.so.580.95.05"], "580.95.05"),
    (["libcuda.so.550.54.15", "libcuda.so.555.42.06"], "555.42.06"),
    (["libcuda.so.1", "libcuda.so"], None),
    ([], None),
])
def test_compat_driver_version(names, expected):
    """The versioned libcuda file name in compat/ names the forward-compat driver."""
    assert compat_driver_version(names) == expected


def test_h200_fixture_host():
    """/usr/local/cuda -> /etc/alternatives/cuda -> /usr/local/cuda-13.0 resolves inside the root; cuda-13 folds in."""
    info = CudaCollector().collect(make_fixture_host("nvidia-h200-ubuntu2404"))
    assert info == CudaInfo(default_path="/usr/local/cuda-13.0", toolkits=[
        CudaToolkit(path="/usr/local/cuda-13.0", version="13.0.2", compat_driver_version="580.95.05")])


def test_several_toolkits_sorted_by_version(tmp_path):
    """Every cuda-X.Y directory is listed, oldest first; one without a version file sorts by its name."""
    host = tree_host(tmp_path, {
        "/usr/local/cuda-12.4/version.json": '{"cuda": {"name": "CUDA SDK", "version": "12.4.1"}}',
        "/usr/local/cuda-12.4/compat/libcuda.so.550.54.15": "",
        "/usr/local/cuda-11.8/version.txt": "CUDA Version 11.8.89\n",
        "/usr/local/cuda-12.10/bin/nvcc": "",
        "/usr/local/bin/tool": "",
    }, links={"/usr/local/cuda": "cuda-12.4"})
    info = CudaCollector().collect(host)
    assert info == CudaInfo(default_path="/usr/local/cuda-12.4", toolkits=[
        CudaToolkit(path="/usr/local/cuda-11.8", version="11.8.89"),
        CudaToolkit(path="/usr/local/cuda-12.4", version="12.4.1", compat_driver_version="550.54.15"),
        CudaToolkit(path="/usr/local/cuda-12.10"),
    ])


def test_component_install_without_version_json_reads_cuda_h(tmp_path):
    """The real H200 host's layout: cuda-* component packages, no version.json, include -> targets/.../include."""
    host = tree_host(tmp_path, {
        "/usr/local/cuda-13.0/targets/x86_64-linux/include/cuda.h": "#define CUDA_VERSION 13000\n",
        "/usr/local/cuda-13.0/compat/libcuda.so.580.95.05": "",
    }, links={"/usr/local/cuda-13.0/include": "targets/x86_64-linux/include", "/usr/local/cuda": "cuda-13.0",
              "/usr/local/cuda-13": "cuda-13.0"})
    assert CudaCollector().collect(host) == CudaInfo(default_path="/usr/local/cuda-13.0", toolkits=[
        CudaToolkit(path="/usr/local/cuda-13.0", version="13.0", compat_driver_version="580.95.05")])


@pytest.mark.parametrize("define_at", [
    10_000,  # where CUDA 13.0's cuda.h has it (line 263): only the head is read
    _CUDA_H_HEAD_CHARS - len("#define CUDA_VERSION 130"),  # the head ends inside the number: not read as 130
    200_000,  # past the head: the whole file is read
])
def test_cuda_h_version_found_wherever_the_define_is(tmp_path, define_at):
    """The define is read from cuda.h's head when it is there, from the whole file otherwise, never half."""
    padding = ("/* " + "x" * 76 + " */\n") * (define_at // 82 + 1)
    text = padding[:define_at - 1] + "\n#define CUDA_VERSION 13000\n" + "/* tail */\n" * 20_000
    assert text.index("#define CUDA_VERSION") == define_at
    host = tree_host(tmp_path, {"/usr/local/cuda-13.0/include/cuda.h": text}, links={"/usr/local/cuda": "cuda-13.0"})
    assert [t.version for t in CudaCollector().collect(host).toolkits] == ["13.0"]


def test_invalid_version_json_falls_back_to_version_txt(tmp_path):
    """A corrupt version.json does not hide the version that version.txt gives."""
    host = tree_host(tmp_path, {"/usr/local/cuda-11.8/version.json": "{not json",
                                "/usr/local/cuda-11.8/version.txt": "CUDA Version 11.8.89\n"})
    assert CudaCollector().collect(host).toolkits == [CudaToolkit(path="/usr/local/cuda-11.8", version="11.8.89")]


def test_plain_directory_at_usr_local_cuda_is_a_toolkit(tmp_path):
    """A runfile install straight into /usr/local/cuda (no link) is itself the default toolkit."""
    host = tree_host(tmp_path, {"/usr/local/cuda/version.txt": "CUDA Version 10.2.89\n"})
    assert CudaCollector().collect(host) == CudaInfo(
        default_path="/usr/local/cuda", toolkits=[CudaToolkit(path="/usr/local/cuda", version="10.2.89")])


def test_toolkit_linked_from_elsewhere_is_recorded_at_its_real_path(tmp_path):
    """A cuda-X.Y link to another directory is listed once, under the path its files are at."""
    host = tree_host(tmp_path, {"/opt/cuda-12.2/version.json": '{"cuda": {"version": "12.2.2"}}'},
                     links={"/usr/local/cuda-12.2": "/opt/cuda-12.2", "/usr/local/cuda": "/usr/local/cuda-12.2"})
    assert CudaCollector().collect(host) == CudaInfo(
        default_path="/opt/cuda-12.2", toolkits=[CudaToolkit(path="/opt/cuda-12.2", version="12.2.2")])


def test_dangling_default_link_is_still_reported(tmp_path):
    """/usr/local/cuda pointing at a removed toolkit is recorded, so the breakage shows."""
    host = tree_host(tmp_path, {}, links={"/usr/local/cuda": "/usr/local/cuda-12.1"})
    assert CudaCollector().collect(host) == CudaInfo(default_path="/usr/local/cuda-12.1", toolkits=[])


def test_no_toolkit_is_unavailable(tmp_path):
    """A host without /usr/local/cuda* has no CUDA section."""
    host = tree_host(tmp_path, {"/usr/local/bin/tool": ""})
    with pytest.raises(CollectorUnavailable, match="no CUDA toolkit"):
        CudaCollector().collect(host)


def test_debian_cuda_packages_give_the_release_without_usr_local_cuda() -> None:
    """Debian 13's CUDA 12.4 (control stanzas of the archive): no toolkit tree, the packages listed with the CUDA
    release after their tilde, the release from nvidia-cuda-toolkit."""
    info = CudaCollector().collect(make_fixture_host("debian13-rocm-cuda"))
    assert info.toolkits == [] and info.default_path is None
    assert info.packaged_release == "12.4.1"
    by_name = {p.package: (p.version, p.release) for p in info.packaged}
    assert by_name["libcufft11"] == ("11.2.1.3~12.4.1-2", "12.4.1")
    assert set(by_name) == {"libcublas12", "libcublaslt12", "libcudart12", "libcufft11", "libnvrtc-builtins12.4",
                            "libnvrtc12", "nvidia-cuda-toolkit"}


def test_runtime_alone_gives_the_release(tmp_path):
    """Only libcudart12 installed (no toolkit): its release is the host's CUDA release."""
    status = "Package: libcudart12\nStatus: install ok installed\nArchitecture: amd64\nVersion: 12.4.127~12.4.1-8\n\n"
    assert packaged_release(packaged_cuda(status.encode())) == "12.4.1"
    host = tree_host(tmp_path, {"/var/lib/dpkg/status": status})
    assert CudaCollector().collect(host).packaged_release == "12.4.1"


def test_no_cuda_at_all_is_absent(tmp_path):
    """A dpkg host with neither a toolkit tree nor a CUDA package: the collector says absent."""
    host = tree_host(tmp_path, {"/var/lib/dpkg/status": "Package: bash\nStatus: install ok installed\n"
                                                         "Architecture: amd64\nVersion: 5.2-1\n\n"})
    with pytest.raises(CollectorUnavailable):
        CudaCollector().collect(host)


@pytest.mark.parametrize(("names", "expected"), [
    (["libcudart.so.12", "libcudart.so.12.4.127"], "12.4"),  # Debian 13's files
    (["libcudart.so.11.8.89", "libcudart.so.12.4.127"], "12.4"),
    (["libcuda.so.550.163.01", "libcudart.so.12"], None),  # the driver's libcuda and a bare SONAME link say nothing
])
def test_cudart_library_release(names, expected):
    """The runtime's file names the CUDA major.minor; the newest wins."""
    assert cudart_library_release(names) == expected


def test_cudart_library_without_a_package_database_gives_the_release(tmp_path):
    """No dpkg status and no /usr/local/cuda (libraries copied into an image): the runtime's file gives 12.4."""
    host = tree_host(tmp_path, {"/usr/lib/x86_64-linux-gnu/libcudart.so.12.4.127": ""})
    info = CudaCollector().collect(host)
    assert (info.packaged_release, info.packaged, info.toolkits) == ("12.4", [], [])
