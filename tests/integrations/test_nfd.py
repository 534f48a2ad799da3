"""The NFD features file: labels, exact rendering, label-safe values, the 64 kB cap and the atomic write."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

from agent.integrations import nfd
from agent.integrations.nfd import NfdView, is_label_value, label_value, render_features, write_features
from agent.report.plain import PlainPairing
from tests.integrations.features_format import FormatError, parse_features

NOW = dt.datetime(2026, 12, 3, 15, 57, 37, tzinfo=dt.timezone.utc)
EXPIRES = NOW + dt.timedelta(hours=1)
ROCM_HOST = PlainPairing(os_id="ubuntu", os_version_id="22.04", kernel_running="6.8.0-45-generic",
                    kernel_next_boot="6.8.0-45-generic", amdgpu_loaded="6.8.5", rocm="6.2.4",
                    gpu_count=8, gpu_models="AMD Instinct MI300X")
CUDA_HOST = PlainPairing(os_id="rhel", os_version_id="9.4", kernel_running="5.14.0-427.13.1.el9_4.x86_64",
                    kernel_next_boot="5.14.0-503.11.1.el9_5.x86_64", nvidia_loaded="550.54.15",
                    cuda_driver_api="12.4", gpu_count=8, gpu_models="NVIDIA H200")


def test_compliant_rocm_host_renders_exactly() -> None:
    """A compliant ROCm host that passed its health check: expiry first, then the labels in a fixed order."""
    view = NfdView(agent_version="0.9.0", compliant=True, policy="MI300X fleet (2026 Q4)", pairing=ROCM_HOST,
                   snapshot_at_seconds=NOW.timestamp(), health_status="pass", health_at_seconds=NOW.timestamp() - 60)
    assert render_features(view, EXPIRES) == (
        "# +expiry-time=2026-12-03T16:57:37Z\n"
        "gpuguard.io/compliant=true\n"
        "gpuguard.io/policy=MI300X_fleet_2026_Q4\n"
        "gpuguard.io/health=pass\n"
        "gpuguard.io/health-ok=true\n"
        "gpuguard.io/health-at=20261203T155637Z\n"
        "gpuguard.io/os=ubuntu-22.04\n"
        "gpuguard.io/kernel=6.8.0-45-generic\n"
        "gpuguard.io/amdgpu-driver=6.8.5\n"
        "gpuguard.io/rocm=6.2.4\n"
        "gpuguard.io/gpu-count=8\n"
        "gpuguard.io/reboot-needed=false\n"
        "gpuguard.io/snapshot-at=20261203T155737Z\n"
        "gpuguard.io/agent-version=0.9.0\n")


def test_violating_cuda_host_with_failed_health_and_pending_reboot_renders_exactly() -> None:
    """Not compliant (2 rules), cpu_fallback, and a different next-boot kernel: all visible."""
    view = NfdView(agent_version="0.9.0+dev", compliant=False, violated_rules=2, pairing=CUDA_HOST,
                   snapshot_at_seconds=NOW.timestamp(), health_status="cpu_fallback",
                   health_at_seconds=NOW.timestamp())
    assert render_features(view, EXPIRES) == (
        "# +expiry-time=2026-12-03T16:57:37Z\n"
        "gpuguard.io/compliant=false\n"
        "gpuguard.io/violations=2\n"
        "gpuguard.io/health=cpu_fallback\n"
        "gpuguard.io/health-ok=false\n"
        "gpuguard.io/health-at=20261203T155737Z\n"
        "gpuguard.io/os=rhel-9.4\n"
        "gpuguard.io/kernel=5.14.0-427.13.1.el9_4.x86_64\n"
        "gpuguard.io/nvidia-driver=550.54.15\n"
        "gpuguard.io/cuda=12.4\n"
        "gpuguard.io/gpu-count=8\n"
        "gpuguard.io/reboot-needed=true\n"
        "gpuguard.io/snapshot-at=20261203T155737Z\n"
        "gpuguard.io/agent-version=0.9.0_dev\n")


def test_a_fresh_daemon_says_compliance_is_unknown_and_nothing_else() -> None:
    """Before the first snapshot: compliance unknown, the agent version, no guesses."""
    assert render_features(NfdView(agent_version="1.0"), EXPIRES) == (
        "# +expiry-time=2026-12-03T16:57:37Z\ngpuguard.io/compliant=unknown\ngpuguard.io/agent-version=1.0\n")


@pytest.mark.parametrize("status, ok", [("busy", "true"), ("deferred", None), ("skipped", None),
                                        ("regression", "false"), ("timeout", "false"), ("failed", "false")])
def test_busy_and_deferred_are_visible_and_only_failures_say_health_not_ok(status: str, ok: str) -> None:
    """busy counts as ok (functional checks passed); deferred and skipped have no verdict at all."""
    _, found = parse_features(render_features(NfdView(agent_version="1", health_status=status), EXPIRES))
    assert found["gpuguard.io/health"] == status
    assert found.get("gpuguard.io/health-ok") == ok


def test_an_installed_but_not_loaded_driver_means_reboot_needed() -> None:
    """The snapshot's driver_installed_not_loaded finding sets reboot-needed even with the same kernel."""
    view = NfdView(agent_version="1", pairing=ROCM_HOST, snapshot_at_seconds=NOW.timestamp(),
                   finding_kinds=("driver_installed_not_loaded",))
    assert parse_features(render_features(view, EXPIRES))[1]["gpuguard.io/reboot-needed"] == "true"


@pytest.mark.parametrize("text, value", [
    ("6.2.4", "6.2.4"),
    ("5.14.0-427.13.1.el9_4.x86_64", "5.14.0-427.13.1.el9_4.x86_64"),
    ("1:6.8.5-2041575.22.04", "1_6.8.5-2041575.22.04"),
    ("0.9.0+dev", "0.9.0_dev"),
    ("AMD Instinct MI300X", "AMD_Instinct_MI300X"),
    ("-leading.and.trailing_", "leading.and.trailing"),
    ("  ", ""),
    ("äöü", ""),
    ("x" * 70, "x" * 63),
    ("a" * 62 + "-b", "a" * 62),
    ("", ""),
])
def test_label_values_are_made_valid(text: str, value: str) -> None:
    """Other characters become _, the ends are alphanumeric, at most 63 characters."""
    assert label_value(text) == value
    assert is_label_value(value)


@pytest.mark.parametrize("value, valid", [("", True), ("a", True), ("a.b-c_d", True), ("-a", False),
                                          ("a_", False), ("a b", False), ("a:b", False), ("x" * 64, False),
                                          ("x" * 63, True)])
def test_is_label_value_follows_the_kubernetes_rule(value: str, valid: bool) -> None:
    """Empty or 1-63 characters, alphanumeric at both ends, [-_.A-Za-z0-9] inside."""
    assert is_label_value(value) is valid


def test_hostile_pairing_strings_still_render_a_valid_file() -> None:
    """Spaces, colons, slashes, newlines and overlong strings from a host never break the format."""
    odd = PlainPairing(os_id="evil\nhost=1", os_version_id="x/y", kernel_running="k " * 80, rocm=":::",
                  amdgpu_loaded="\u00e9" * 5, gpu_count=1)
    _, found = parse_features(render_features(NfdView(agent_version="v", pairing=odd), EXPIRES))
    assert found["gpuguard.io/os"] == "evil_host_1-x_y"
    assert "gpuguard.io/rocm" not in found and "gpuguard.io/amdgpu-driver" not in found
    assert len(found["gpuguard.io/kernel"]) <= 63


def test_the_file_is_capped_at_64_kB(monkeypatch: pytest.MonkeyPatch) -> None:
    """Labels that would pass 64 kB are left out whole; what is written still parses."""
    many = [(f"label-{i}", "v" * 60) for i in range(2000)]
    monkeypatch.setattr(nfd, "labels", lambda view: many)
    text = render_features(NfdView(agent_version="1"), EXPIRES)
    assert len(text.encode()) <= nfd.MAX_FILE_BYTES
    assert len(text.encode()) > nfd.MAX_FILE_BYTES - 100
    _, found = parse_features(text)
    assert len(found) == len(text.splitlines()) - 1


def test_the_strict_reader_catches_broken_files() -> None:
    """The test's reader is strict: a bad value, a missing namespace or a bad expiry is refused."""
    for bad in ("gpuguard.io/x=a b\n", "x=1\n", "# +expiry-time=tomorrow\n", "gpuguard.io/x=1",
                "gpuguard.io/x=1\n# +expiry-time=2026-12-03T16:57:37Z\n"):
        with pytest.raises(FormatError):
            parse_features(bad)


def test_rendered_file_parses_with_an_expiry_in_the_future() -> None:
    """Expiry present, in the future, RFC 3339; every label in our namespace."""
    expiry, found = parse_features(render_features(NfdView(agent_version="1", compliant=True,
                                                           pairing=CUDA_HOST), EXPIRES))
    assert expiry == EXPIRES and expiry > NOW
    assert found and all(name.startswith("gpuguard.io/") for name in found)


# --- the writer -------------------------------------------------------------------------------------------------

def test_write_replaces_the_file_through_a_dot_file_rename(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The new text is written to a dot-file (ignored by NFD) in the same directory, then renamed over."""
    target = tmp_path / "gpuguard"
    target.write_text("old\n")
    renames = []
    real_replace = os.replace

    def watching_replace(src: str, dst: object) -> None:
        renames.append((os.path.basename(src), os.path.dirname(src), Path(src).read_text(), target.read_text()))
        real_replace(src, dst)

    monkeypatch.setattr(nfd.os, "replace", watching_replace)
    assert write_features(str(target), "new\n") is True
    [(name, directory, staged, visible)] = renames
    assert name.startswith(".gpuguard.") and directory == str(tmp_path)
    assert staged == "new\n" and visible == "old\n"  # the target was never partly written
    assert target.read_text() == "new\n" and sorted(os.listdir(tmp_path)) == ["gpuguard"]
    assert oct(target.stat().st_mode & 0o777) == "0o644"


def test_a_failed_write_leaves_the_old_file_and_no_dot_file(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure before the rename (disk full) keeps the old labels and cleans up."""
    target = tmp_path / "gpuguard"
    target.write_text("old\n")

    def full_disk(src: str, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(nfd.os, "replace", full_disk)
    with pytest.raises(OSError):
        write_features(str(target), "new\n")
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["gpuguard"]


def test_no_directory_means_nfd_is_not_set_up_and_nothing_is_written(tmp_path: Path) -> None:
    """The directory is never created."""
    assert write_features(str(tmp_path / "features.d" / "gpuguard"), "x\n") is False
    assert not (tmp_path / "features.d").exists()


def test_text_over_64_kB_is_refused(tmp_path: Path) -> None:
    """The writer refuses what NFD would not read whole."""
    with pytest.raises(ValueError):
        write_features(str(tmp_path / "gpuguard"), "x" * (nfd.MAX_FILE_BYTES + 1))
    assert os.listdir(tmp_path) == []


def test_a_relative_features_path_is_a_config_error() -> None:
    """nfd_features_file is absolute or empty; the lifetime has a floor above the one-minute refresh."""
    from pydantic import ValidationError

    from agent.report.settings import ReportSettings

    with pytest.raises(ValidationError, match="absolute path"):
        ReportSettings(nfd_features_file="features.d/gpuguard")
    with pytest.raises(ValidationError):
        ReportSettings(nfd_lifetime_seconds=60)


@pytest.mark.parametrize("restorable, exact, label", [(33, True, "true"), (32, True, "false"), (33, False, "false")])
def test_rollback_labels_say_whether_every_guarded_package_is_restorable_exactly(restorable: int, exact: bool,
                                                                                  label: str) -> None:
    """rollback-restorable is true only when all guarded packages have an exact kept file; rollback-coverage counts."""
    view = NfdView(agent_version="1", rollback_guarded=33, rollback_restorable=restorable, rollback_exact=exact)
    found = parse_features(render_features(view, EXPIRES))[1]
    assert found["gpuguard.io/rollback-restorable"] == label
    assert found["gpuguard.io/rollback-coverage"] == f"{restorable}-of-33"
    assert "gpuguard.io/rollback-restorable" not in parse_features(render_features(NfdView(agent_version="1"),
                                                                                    EXPIRES))[1]
