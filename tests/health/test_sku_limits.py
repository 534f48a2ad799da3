"""The per-SKU physical limits: lookup by PCI id and by the names NVML and amdsmi give, the fallback, the bound."""

from __future__ import annotations

from typing import Optional

import pytest

from agent.health.sku_limits import MARGIN, SKUS, beyond, bound_for, fastest_known, lookup, parse_pci_id


@pytest.mark.parametrize("device, vendor, row", [
    ("0x2335", "0x10de", "H200 SXM"), ("0x2330", None, "H100 SXM"), ("2331", None, "H100 PCIe"),
    (0x2321, 0x10DE, "H100 NVL"), ("0x233B", None, "H200 NVL"), ("0x20b2", None, "A100 SXM 80GB"),
    ("0x20f1", None, "A100 40GB"), ("0x74a1", "0x1002", "MI300X"), ("0x74a5", None, "MI325X"),
    ("0x740c", None, "MI250X"), ("0x740f", None, "MI210"),
])
def test_lookup_by_pci_id(device: object, vendor: object, row: str) -> None:
    """A PCI device id (int, 0x-hex or bare hex, with or without the vendor) finds its row."""
    assert lookup(pci_device_id=device, pci_vendor_id=vendor) == SKUS[row]


@pytest.mark.parametrize("model, row", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA H200 NVL", "H200 NVL"), ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB"), ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
    ("AMD Instinct MI300X", "MI300X"), ("AMD Instinct MI325X", "MI325X"), ("AMD Instinct MI250X/MI250", "MI250X"),
    ("AMD Instinct MI210", "MI210"), ("NVIDIA GeForce RTX 4090", None), ("", None),
])
def test_lookup_by_model_name(model: str, row: Optional[str]) -> None:
    """NVML's and amdsmi's model names find their row; an unknown name is None."""
    assert lookup(model) == (SKUS[row] if row else None)


def test_the_pci_id_wins_over_the_name_and_a_wrong_vendor_finds_nothing() -> None:
    """The id is exact where a name may be vague; an id under another vendor's id falls back to the name."""
    assert lookup("NVIDIA H100", "0x2335") == SKUS["H200 SXM"]
    assert lookup(None, "0x2335", "0x1002") is None
    assert lookup("AMD Instinct MI210", "0xffff") == SKUS["MI210"]


@pytest.mark.parametrize("value, parsed", [("0x74a1", 0x74A1), ("74A1\n".strip(), 0x74A1), ("0x", None),
                                           ("zz", None), ("0x123456", None), (True, None), (0, None)])
def test_parse_pci_id(value: object, parsed: Optional[int]) -> None:
    """PCI ids parse from sysfs and amdsmi forms; anything else is None."""
    assert parse_pci_id(value) == parsed


def test_bound_for_a_host() -> None:
    """One SKU bounds by its row; an unknown GPU (or none seen) by the fastest known part; a mix by each maximum."""
    assert bound_for([SKUS["H200 SXM"], SKUS["H200 SXM"]]) == SKUS["H200 SXM"]
    assert bound_for([SKUS["H200 SXM"], None]) == fastest_known() == bound_for([])
    mixed = bound_for([SKUS["A100 40GB"], SKUS["MI210"]])
    assert (mixed.bf16_tflops, mixed.hbm_gbps) == (312.0, 1638.4)


def test_beyond_the_peak_with_its_margin() -> None:
    """A figure is refused only above peak x MARGIN; unbounded figures pass."""
    h200 = SKUS["H200 SXM"]
    assert beyond("gemm_bf16_tflops", 989.5 * MARGIN, h200) is None
    assert beyond("gemm_bf16_tflops", 9.99e6, h200) == "gemm_bf16_tflops 9.99e+06 > 1137.92 (H200 SXM datasheet " \
                                                       "peak x 1.15)"
    assert beyond("copy_bandwidth_gbps", 4269.0, h200) is None  # the H200's measured copy (docs/hardware.md)
    assert beyond("train_step_seconds", 1e9, h200) is None
