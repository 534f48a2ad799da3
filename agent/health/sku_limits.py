"""What a GPU can physically do: datasheet peaks per SKU, looked up by what root sees (pure, standard library).

A figure the probe reports above its GPU's datasheet peak (times ``MARGIN``) is no measurement: it never enters a
baseline (agent/health/baseline.py), and a stored baseline above it is suspicious. The lookup takes what the SMI
library or sysfs gives root, never the probe's own words: the PCI device id (``/sys/bus/pci/devices/<bdf>/device``,
amdsmi's ``device_id``) first, else the model name (NVML ``nvmlDeviceGetName``, amdsmi ``market_name``). An unknown
SKU is ``None``; ``bound_for`` then falls back to the fastest part in the table (a GPU faster than every row gets
no baseline until its row is added: its figures are refused, never believed).

Peaks are dense (no structured sparsity: datasheets quote bf16/fp16 "with sparsity" at twice the dense rate; the
probe's GEMM is dense). ``hbm_gbps`` bounds the device copy (bytes read plus written per second cannot exceed the
memory's bandwidth) and, loosely, the all-reduce's bus bandwidth (every byte of it passes through that memory).
Where a name or id leaves the variant open (an ``H100`` of unknown form factor), the faster variant's row is used:
a bound may be loose, never tighter than the part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

# How far above the datasheet peak a figure may be before it is refused: boost clocks above the datasheet's, a
# timer's granularity on short loops, the probe's own rounding. A measured figure is far below its peak (the H200:
# GEMM 792 of 989 TFLOP/s, copy 4,269 of 4,800 GB/s: docs/hardware.md).
MARGIN = 1.15


@dataclass(frozen=True)
class SkuLimits:
    """One SKU's datasheet peaks (dense bf16/fp16 TFLOP/s, HBM GB/s)."""

    name: str
    bf16_tflops: float
    fp16_tflops: float
    hbm_gbps: float

    def ceiling(self, metric: str) -> Optional[float]:
        """The highest believable value of a probe figure (its field name) on this SKU; None for a figure the
        table does not bound."""
        peak = {"gemm_bf16_tflops": self.bf16_tflops, "gemm_fp16_tflops": self.fp16_tflops,
                "copy_bandwidth_gbps": self.hbm_gbps, "bus_bandwidth_gbps": self.hbm_gbps}.get(metric)
        return None if peak is None else peak * MARGIN


# name: peaks and source. The PCI ids and name patterns below point at these rows.
SKUS: Dict[str, SkuLimits] = {
    # NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100): SXM bf16/fp16 1,979 TFLOPS with
    # sparsity, 3.35 TB/s; PCIe 1,513 TFLOPS with sparsity, 2 TB/s; NVL 1,671 TFLOPS with sparsity, 3.9 TB/s.
    "H100 SXM": SkuLimits("H100 SXM", 989.5, 989.5, 3350.0),
    "H100 PCIe": SkuLimits("H100 PCIe", 756.5, 756.5, 2000.0),
    "H100 NVL": SkuLimits("H100 NVL", 835.5, 835.5, 3900.0),
    # NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200): SXM bf16/fp16 1,979 TFLOPS with
    # sparsity, 4.8 TB/s; NVL 1,671 TFLOPS with sparsity, 4.8 TB/s.
    "H200 SXM": SkuLimits("H200 SXM", 989.5, 989.5, 4800.0),
    "H200 NVL": SkuLimits("H200 NVL", 835.5, 835.5, 4800.0),
    # NVIDIA B200 and GB200 (Blackwell): bf16/fp16 2,250 TFLOPS dense (4,500 with sparsity) for HGX B200 at
    # 1,000 W, 2,500 dense for the GB200's B200 at 1,200 W; HBM3e 8 TB/s (NVIDIA's HGX/GB200 figures as tabulated
    # at glennklockwood.com/garden/processors/B200; 2026-12-06).
    "B200": SkuLimits("B200", 2250.0, 2250.0, 8000.0),
    "GB200": SkuLimits("GB200", 2500.0, 2500.0, 8000.0),
    # NVIDIA GH200 Grace Hopper Superchip page: bf16/fp16 1,979 TFLOPS with sparsity, HBM3e up to 4.9 TB/s.
    "GH200": SkuLimits("GH200", 989.5, 989.5, 4900.0),
    # NVIDIA L40S datasheet: bf16/fp16 733 TFLOPS with sparsity (366.5 dense), GDDR6 864 GB/s.
    "L40S": SkuLimits("L40S", 366.5, 366.5, 864.0),
    # NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100): bf16/fp16 312 TFLOPS dense (624
    # with sparsity); 80GB SXM 2,039 GB/s, 80GB PCIe 1,935 GB/s, 40GB (SXM and PCIe) 1,555 GB/s.
    "A100 SXM 80GB": SkuLimits("A100 SXM 80GB", 312.0, 312.0, 2039.0),
    "A100 PCIe 80GB": SkuLimits("A100 PCIe 80GB", 312.0, 312.0, 1935.0),
    "A100 40GB": SkuLimits("A100 40GB", 312.0, 312.0, 1555.0),
    # AMD Instinct MI300X data sheet (amd.com/en/products/accelerators/instinct/mi300/mi300x.html): fp16/bf16
    # 1,307.4 TFLOPS dense (2,614.9 with sparsity), HBM3 5.3 TB/s.
    "MI300X": SkuLimits("MI300X", 1307.4, 1307.4, 5300.0),
    # AMD Instinct MI325X data sheet (amd.com/en/products/accelerators/instinct/mi300/mi325x.html): fp16/bf16
    # 1,307.4 TFLOPS dense, HBM3E 6 TB/s.
    "MI325X": SkuLimits("MI325X", 1307.4, 1307.4, 6000.0),
    # AMD Instinct MI355X (CDNA 4): FP8 5 PFLOPS dense (AMD at ISSCC 2026), so fp16/bf16 2,500 dense; HBM3E 8 TB/s;
    # the MI350X trades about 8 % of the MI355X's peak for 1 kW (AMD's launch figures, The Register 2025-06-12).
    "MI355X": SkuLimits("MI355X", 2500.0, 2500.0, 8000.0),
    "MI350X": SkuLimits("MI350X", 2300.0, 2300.0, 8000.0),
    # AMD Instinct MI300A data sheet: fp16/bf16 980.6 TFLOPS dense, HBM3 5.3 TB/s.
    "MI300A": SkuLimits("MI300A", 980.6, 980.6, 5300.0),
    # AMD Instinct MI250X data sheet (amd.com/en/products/accelerators/instinct/mi200/mi250x.html): fp16/bf16
    # 383 TFLOPS, HBM2e 3.2 TB/s (3,276.8 GB/s). The MI250 (362.1 TFLOPS) shares its PCI id: the MI250X bounds both.
    "MI250X": SkuLimits("MI250X", 383.0, 383.0, 3276.8),
    # AMD Instinct MI210 data sheet (amd.com/en/products/accelerators/instinct/mi200/mi210.html): fp16/bf16
    # 181 TFLOPS, HBM2e 1.6 TB/s (1,638.4 GB/s).
    "MI210": SkuLimits("MI210", 181.0, 181.0, 1638.4),
    # AMD Instinct MI100 data sheet: bf16 92.3 TFLOPS, fp16 184.6 TFLOPS, HBM2 1.2288 TB/s.
    "MI100": SkuLimits("MI100", 92.3, 184.6, 1228.8),
}

# (vendor id, device id) -> row. Ids as in the PCI ID repository (pci-ids.ucw.cz) and NVIDIA's gpu-admin-tools.
PCI_IDS: Dict[Tuple[int, int], str] = {
    (0x10DE, 0x2330): "H100 SXM",        # GH100 [H100 SXM5 80GB]
    (0x10DE, 0x2331): "H100 PCIe",       # GH100 [H100 PCIe]
    (0x10DE, 0x2321): "H100 NVL",        # GH100 [H100 NVL]
    (0x10DE, 0x2335): "H200 SXM",        # GH100 [H200 SXM 141GB]
    (0x10DE, 0x233B): "H200 NVL",        # GH100 [H200 NVL]
    (0x10DE, 0x20B0): "A100 40GB",       # GA100 [A100 SXM4 40GB]
    (0x10DE, 0x20B2): "A100 SXM 80GB",   # GA100 [A100 SXM4 80GB]
    (0x10DE, 0x20B5): "A100 PCIe 80GB",  # GA100 [A100 PCIe 80GB]
    (0x10DE, 0x20F1): "A100 40GB",       # GA100 [A100 PCIe 40GB]
    (0x1002, 0x74A1): "MI300X",          # Aqua Vanjaram [Instinct MI300X]
    (0x1002, 0x74A5): "MI325X",          # Aqua Vanjaram [Instinct MI325X]
    (0x1002, 0x74A0): "MI300A",          # Aqua Vanjaram [Instinct MI300A]
    (0x1002, 0x738C): "MI100",           # Arcturus GL-XL [Instinct MI100]
    (0x1002, 0x740C): "MI250X",          # Aldebaran/MI200 [Instinct MI250X/MI250]
    (0x1002, 0x740F): "MI210",           # Aldebaran/MI200 [Instinct MI210]
}

# Model names as NVML and amdsmi give them ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB",
# "AMD Instinct MI300X"), matched in this order (the specific before the general) on the name upper-cased with
# "-" and "_" as spaces.
_NAME_PATTERNS: Tuple[Tuple[str, str], ...] = (
    (r"\bH200\b.*\bNVL\b", "H200 NVL"),
    (r"\bH200\b", "H200 SXM"),
    (r"\bH100\b.*\bNVL\b", "H100 NVL"),
    (r"\bH100\b.*\bPCIE\b", "H100 PCIe"),
    (r"\bH100\b", "H100 SXM"),
    (r"\bGH200\b", "GH200"),
    (r"\bGB200\b", "GB200"),
    (r"\bL40S\b", "L40S"),
    (r"\bB200\b", "B200"),
    (r"\bA100\b.*\bPCIE\b.*\b80GB\b|\bA100\b.*\b80GB\b.*\bPCIE\b", "A100 PCIe 80GB"),
    (r"\bA100\b.*\b40GB\b", "A100 40GB"),
    (r"\bA100\b", "A100 SXM 80GB"),
    (r"\bMI355X\b", "MI355X"),
    (r"\bMI350X\b", "MI350X"),
    (r"\bMI325X\b", "MI325X"),
    (r"\bMI300A\b", "MI300A"),
    (r"\bMI300X\b", "MI300X"),
    (r"\bMI250X?\b", "MI250X"),
    (r"\bMI210\b", "MI210"),
    (r"\bMI100\b", "MI100"),
)

VENDOR_IDS = {"nvidia": 0x10DE, "amd": 0x1002}


def parse_pci_id(value: object) -> Optional[int]:
    """A PCI id from an int, ``0x74a1``, ``0x74A1`` or ``74a1`` (sysfs, amdsmi); None when it is none of these."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 < value <= 0xFFFF else None
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    text = text[2:] if text.startswith("0x") else text
    if not text or len(text) > 4 or any(c not in "0123456789abcdef" for c in text):
        return None
    number = int(text, 16)
    return number or None


def lookup(model: Optional[str] = None, pci_device_id: object = None,
           pci_vendor_id: object = None) -> Optional[SkuLimits]:
    """The SKU's limits from its PCI device id (with the vendor id when known), else its model name; None when
    neither is in the table."""
    device = parse_pci_id(pci_device_id)
    if device is not None:
        vendor = parse_pci_id(pci_vendor_id)
        rows = [row for (v, d), row in PCI_IDS.items() if d == device and (vendor is None or v == vendor)]
        if rows:
            return SKUS[rows[0]]
    if model:
        name = " " + re.sub(r"[-_]", " ", model.upper()) + " "
        for pattern, row in _NAME_PATTERNS:
            if re.search(pattern, name):
                return SKUS[row]
    return None


def fastest_known() -> SkuLimits:
    """Every column's highest peak in the table: the bound for a GPU the table does not know."""
    rows = SKUS.values()
    return SkuLimits("any known SKU", max(r.bf16_tflops for r in rows), max(r.fp16_tflops for r in rows),
                     max(r.hbm_gbps for r in rows))


def bound_for(skus: Sequence[Optional[SkuLimits]]) -> SkuLimits:
    """The limits for a host's GPUs: each column's highest of its SKUs; the fastest known part when a GPU's SKU is
    unknown or no GPU was seen."""
    if not skus or any(s is None for s in skus):
        return fastest_known()
    known = [s for s in skus if s is not None]
    if len({s.name for s in known}) == 1:
        return known[0]
    return SkuLimits(" + ".join(sorted({s.name for s in known})), max(s.bf16_tflops for s in known),
                     max(s.fp16_tflops for s in known), max(s.hbm_gbps for s in known))


def beyond(metric: str, value: float, limits: SkuLimits) -> Optional[str]:
    """Why ``value`` of a probe figure is not physically possible on ``limits``' SKU; None when it is."""
    ceiling = limits.ceiling(metric)
    if ceiling is None or value <= ceiling:
        return None
    return f"{metric} {value:g} > {ceiling:g} ({limits.name} datasheet peak x {MARGIN:g})"
