"""The host context: one record of the facts every judgement reads, read off a root with only the facts asked for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Tuple

import pytest

from agent.hostfacts.alternatives import ActiveTree
from agent.hostfacts.context import (
    AMDGPU_MODULE,
    GPU_TARGETS,
    NO_FACTS,
    NVIDIA_MODULE,
    OS_RELEASE,
    HostContext,
    read_host_context,
)
from agent.hostfacts.loaded_modules import module_version
from agent.policy.load import load_and_compile, write_compiled
from tests.conftest import REPO, ROOTS

PARSERS = ("agent.hostfacts.os_release", "agent.hostfacts.kfd", "agent.hostfacts.loaded_modules")
BUILDER = "agent.hostfacts.context"


@pytest.mark.parametrize("scenario,expected", [
    ("mi300x-rocm62-ubuntu2204", HostContext("ubuntu", "22.04", ("gfx942",), {"amdgpu": "6.8.5"})),
    ("rocm7-rhel9", HostContext("rhel", "9.6", ("gfx90a",), {"amdgpu": "6.14.14"},
                                active_tree=ActiveTree("rocm", "/opt/rocm", "/opt/rocm-7.0.2"))),
    ("nvidia-h200-ubuntu2404", HostContext("ubuntu", "24.04", (), {"nvidia": "580.159.04"})),
    ("gpuless-debian12", HostContext("debian", "12")),
])
def test_every_fact_of_a_fixture_root(scenario: str, expected: HostContext) -> None:
    """os-release, the KFD topology's gfx targets (CPU nodes left out) and the loaded modules' versions."""
    assert read_host_context(str(ROOTS / scenario)) == expected


@pytest.mark.parametrize("facts,expected", [
    ((), NO_FACTS),
    ((OS_RELEASE,), HostContext("ubuntu", "22.04")),
    ((GPU_TARGETS,), HostContext(gpu_targets=("gfx942",))),
    ((NVIDIA_MODULE,), HostContext()),
    ((AMDGPU_MODULE,), HostContext(loaded_drivers={"amdgpu": "6.8.5"})),
    ((OS_RELEASE, GPU_TARGETS), HostContext("ubuntu", "22.04", ("gfx942",))),
])
def test_only_the_facts_asked_for_are_read(facts: Tuple[str, ...], expected: HostContext) -> None:
    """A fact not asked for stays unknown, whatever the host has."""
    assert read_host_context(str(ROOTS / "mi300x-rocm62-ubuntu2204"), facts) == expected


def test_an_empty_root_is_unknown_everywhere(tmp_path: Path) -> None:
    """No os-release, no topology, no module: every fact unknown, no error."""
    assert read_host_context(str(tmp_path)) == NO_FACTS


def test_an_unknown_fact_name_is_refused(tmp_path: Path) -> None:
    """A misspelt fact is an error naming the known ones, not a fact silently left unread."""
    with pytest.raises(ValueError, match="unknown host facts \\['os'\\]; known: os_release, gpu_targets"):
        read_host_context(str(tmp_path), ("os",))


def test_the_record_is_immutable_sorted_and_hashable() -> None:
    """Targets deduplicated and sorted, modules sorted; no assignment; equal records hash alike."""
    context = HostContext("debian", "12", ("gfx950", "gfx942", "gfx950"), {"nvidia": "580.1", "amdgpu": "6.8.5"})
    assert context.gpu_targets == ("gfx942", "gfx950")
    assert context.loaded_drivers == (("amdgpu", "6.8.5"), ("nvidia", "580.1"))
    assert (context.loaded("nvidia"), context.loaded("amdgpu"), context.loaded("i915")) == ("580.1", "6.8.5", None)
    with pytest.raises(AttributeError, match="immutable"):
        context.os_id = "ubuntu"  # type: ignore[misc]
    assert hash(context) == hash(HostContext("debian", "12", ("gfx942", "gfx950"),
                                             {"amdgpu": "6.8.5", "nvidia": "580.1"}))


@pytest.mark.parametrize("text,expected", [("6.8.5\n", "6.8.5"), ("  6.14.14  \nextra\n", "6.14.14"), ("\n", None)])
def test_module_version_is_the_first_line_of_the_version_file(tmp_path: Path, text: str, expected: str) -> None:
    """/sys/module/<name>/version, stripped; an empty file is no version."""
    (tmp_path / "sys/module/amdgpu").mkdir(parents=True)
    (tmp_path / "sys/module/amdgpu/version").write_text(text)
    assert module_version(str(tmp_path), "amdgpu") == expected
    assert module_version(str(tmp_path), "nvidia") is None


def _imported_after(code: str, modules: Tuple[str, ...] = PARSERS) -> str:
    """Which of ``modules`` (default: the fact parsers) ``code`` loads in a bare interpreter (python3 -I -S, as the
    packaged hook runs)."""
    script = ("import sys; sys.path.insert(0, sys.argv[1])\n" + code
              + f"\nprint(' '.join(m for m in {modules!r} if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", script, str(REPO)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_a_parser_is_imported_only_for_its_fact() -> None:
    """Importing the builder and reading no fact loads no parser; reading the GPU targets loads only kfd."""
    root = str(ROOTS / "mi300x-rocm62-ubuntu2204")
    assert _imported_after(f"from agent.hostfacts.context import read_host_context\n"
                           f"read_host_context({root!r}, ())") == ""
    assert _imported_after(f"from agent.hostfacts.context import read_host_context, GPU_TARGETS\n"
                           f"read_host_context({root!r}, (GPU_TARGETS,))") == "agent.hostfacts.kfd"


def test_the_hook_reads_no_host_fact_under_a_policy_without_matrix_or_nvidia_rules(tmp_path: Path) -> None:
    """The apt hook (python3 -I -S, protocol v3) refusing an AMD pairing move imports neither the builder nor a
    fact parser: a policy of pairings alone costs the hook nothing for host facts."""
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(
        "Package: rocm-core\nStatus: install ok installed\nArchitecture: amd64\nVersion: 6.2.2.60202-116~22.04\n\n")
    policy = tmp_path / "policy.toml"
    policy.write_text('[policy]\nname = "t"\n[[amd.pairing]]\nname = "rocm-6.2"\namdgpu = "6.2.*"\nrocm = "6.2.*"\n')
    write_compiled(str(tmp_path / "var/lib/gpuguard/policy.compiled.json"), load_and_compile(str(policy))[1])
    text = ("VERSION 3\nAPT::Architecture=amd64\n\n"
            "rocm-core 6.2.2.60202-116~22.04 amd64 none < 6.3.0.60300-39~22.04 amd64 none /x.deb\n")
    code = ("import io, os\nfrom agent.guard.apt.hook import main\n"
            f"r, w = os.pipe(); os.write(w, {text!r}.encode()); os.close(w)\n"
            f"assert main(['--root', {str(tmp_path)!r}], environ={{'APT_HOOK_INFO_FD': str(r)}}, err=io.StringIO()) "
            "== 10")
    assert _imported_after(code, (BUILDER, *PARSERS)) == ""
