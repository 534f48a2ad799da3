"""SMI activity sampling through fake pynvml and amdsmi modules."""

from __future__ import annotations

import time

import pytest

from agent.errors import LibraryUnavailable
from agent.health.activity import ActivitySampler, AmdsmiReader, NvmlReader, open_reader, summarize
from tests.conftest import fake_module_loader
from tests.health.helpers import make_fake_amdsmi, make_fake_nvml


def test_nvml_reader_reads_utilization_and_identity() -> None:
    """NVML gives one utilization per GPU, its PCI address (bytes decoded) and UUID."""
    nvml = make_fake_nvml([[3.0, 0.0], [99.0, 40.0]], bus_ids=["00000000:19:00.0", "00000000:3b:00.0"])
    reader = NvmlReader(nvml)
    assert [d.bdf for d in reader.devices] == ["00000000:19:00.0", "00000000:3b:00.0"]
    assert reader.read() == [3.0, 0.0]
    assert reader.read() == [99.0, 40.0]
    reader.close()
    assert nvml.state["calls"] == ["nvmlInit", "nvmlShutdown"]


def test_nvml_init_error_is_library_unavailable() -> None:
    """An NVML that cannot start is LibraryUnavailable with its reason."""
    with pytest.raises(LibraryUnavailable, match="DriverNotLoaded"):
        NvmlReader(make_fake_nvml([[0.0]], init_error="DriverNotLoaded"))


def test_amdsmi_reader_treats_na_as_no_reading() -> None:
    """amdsmi's "N/A" activity is no reading, not zero."""
    reader = AmdsmiReader(make_fake_amdsmi([55, "N/A"], bdfs=["0000:c1:00.0", "0000:c2:00.0"]))
    assert reader.read() == [55.0, None]


def test_open_reader_picks_the_vendor_library_and_reports_why_none() -> None:
    """The vendor's library is used; with neither loadable, LibraryUnavailable lists both reasons."""
    load = fake_module_loader({"amdsmi": make_fake_amdsmi([0])})
    assert open_reader(load, "amd").library == "amdsmi"
    assert open_reader(load, None).library == "amdsmi"
    with pytest.raises(LibraryUnavailable) as info:
        open_reader(fake_module_loader({}), None)
    assert "pynvml" in str(info.value) and "amdsmi" in str(info.value)


def test_summarize_idle_and_peak() -> None:
    """The first reading is the idle level; the peak ignores missing readings, which are counted."""
    reader = NvmlReader(make_fake_nvml([[0.0]]))
    report = summarize("pynvml", reader.devices, [[5.0], [None], [80.0], [60.0]], 0.02)
    gpu = report.gpus[0]
    assert (gpu.idle_percent, gpu.max_percent, gpu.samples, report.read_errors) == (5.0, 80.0, 3, 1)


@pytest.mark.timeout(120)
def test_sampler_thread_collects_until_stopped() -> None:
    """The sampler reads on its thread between start and stop and reports the peak it saw."""
    nvml = make_fake_nvml([[0.0], [20.0], [90.0]])
    sampler = ActivitySampler(fake_module_loader({"pynvml": nvml}), "nvidia", 0.005)
    sampler.start()
    # Stopped once the thread read all three rows (the idle look and two more), however slowly a loaded machine
    # runs it, instead of after a fixed 0.1 s that may hold fewer reads.
    deadline = time.monotonic() + 60
    while nvml.state["round"] < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    report = sampler.stop()
    assert report.library == "pynvml"
    assert report.gpus[0].idle_percent == 0.0 and report.gpus[0].max_percent == 90.0
    assert report.gpus[0].samples >= 3


def test_sampler_without_library_reports_the_reason() -> None:
    """Without any SMI library the report carries the reason and no GPUs."""
    sampler = ActivitySampler(fake_module_loader({}), None, 0.01)
    sampler.start()
    report = sampler.stop()
    assert report.library is None and report.gpus == [] and "not installed" in report.unavailable_reason


def test_summarize_device_memory_before_low_peak_and_gap() -> None:
    """Memory in use: the first reading is the level before the run, the low covers it, the peak and count do not."""
    reader = NvmlReader(make_fake_nvml([[0.0]]))
    report = summarize("pynvml", reader.devices, [[0.0], [90.0], [90.0], [0.0]], 0.02,
                       memory=[[4 << 30], [1 << 30], [None], [10 << 30]], times=[0.0, 0.02, 0.09, 0.1])
    gpu = report.gpus[0]
    assert (gpu.memory_before_bytes, gpu.memory_low_bytes, gpu.memory_peak_bytes, gpu.memory_samples) == (
        4 << 30, 1 << 30, 10 << 30, 2)
    assert report.max_gap_seconds == 0.07


@pytest.mark.timeout(120)
@pytest.mark.parametrize("library", ["pynvml", "amdsmi"])
def test_sampler_reads_device_memory_on_every_tick(library: str) -> None:
    """NVML's total - free and amdsmi's VRAM used are read on every tick: the rise the run caused is in the report."""
    if library == "pynvml":
        module = make_fake_nvml([[0.0], [0.0], [90.0]], used_bytes=[[1 << 30], [1 << 30], [10 << 30]])
    else:
        module = make_fake_amdsmi([90], vram_used_rows=[[1024], [1024], [10240]])
    sampler = ActivitySampler(fake_module_loader({library: module}), None, 0.005)
    sampler.start()
    deadline = time.monotonic() + 60
    report = None
    while time.monotonic() < deadline:
        time.sleep(0.02)
        if len(sampler._memory) >= 4:  # the look before and three ticks, however slowly a loaded machine runs it
            break
    report = sampler.stop()
    gpu = report.gpus[0]
    assert (gpu.memory_before_bytes, gpu.memory_low_bytes, gpu.memory_peak_bytes) == (1 << 30, 1 << 30, 10 << 30)
    assert gpu.memory_samples >= 3 and report.max_gap_seconds is not None
