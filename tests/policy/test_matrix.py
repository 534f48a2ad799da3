"""The shipped AMD compatibility matrix is well-formed, sourced and consistent."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import PolicyError
from agent.policy.matrix import load_matrix
from agent.policy.releases import amdgpu_driver_release, series

REPO = Path(__file__).resolve().parents[2]
MATRIX = REPO / "policies/amd-compat-matrix.toml"


def test_matrix_loads_and_is_consistent() -> None:
    matrix = load_matrix(str(MATRIX))
    assert matrix.consistency_problems() == []


def test_matrix_covers_rocm_6_0_to_7_x_with_os_kernels_and_gpus() -> None:
    matrix = load_matrix(str(MATRIX))
    rows = {r.series: r for r in matrix.rocm}
    assert {"6.0", "6.1", "6.2", "6.3", "6.4", "7.0", "7.1"} <= set(rows)
    for row in rows.values():
        assert row.os and row.gpus and row.drivers and row.sources
    assert "gfx950" in rows["7.0"].gpus and "gfx950" not in rows["6.4"].gpus
    assert rows["6.3"].kernels["debian:12"] == ["6.1"]


def test_every_source_has_an_address_and_every_table_a_source() -> None:
    matrix = load_matrix(str(MATRIX))
    assert all(s.url.startswith("https://") and s.where for s in matrix.sources)
    assert all(row.sources for row in matrix.driver)


def test_driver_numbering_split() -> None:
    """Up to 6.4 drivers are named after ROCm; 30.x drivers pair with ROCm 7.x, and example versions agree."""
    matrix = load_matrix(str(MATRIX))
    drivers = {d.series: d for d in matrix.driver}
    assert "7.1" in drivers["30.20"].rocm and "7.1" not in drivers["6.3"].rocm
    rows = {r.series: r for r in matrix.rocm}
    assert rows["7.1"].drivers[0] == "30.20" and rows["7.0"].drivers[0] == "30.10"
    for row in matrix.driver:
        if row.example_package:
            assert series(amdgpu_driver_release(row.example_package)) == row.series


def test_a_broken_matrix_reports_every_problem(tmp_path: Path) -> None:
    text = MATRIX.read_text().replace('recorded = "', 'recorded = "x', 1).replace(
        'drivers = ["6.2", "6.1", "6.0", "5.7", "5.6"]', 'drivers = ["9.9", "6.1", "6.0", "5.7", "5.6"]')
    broken = tmp_path / "m.toml"
    broken.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_matrix(str(broken))
    assert any(p.startswith("recorded:") for p in info.value.problems)
    text2 = MATRIX.read_text().replace('drivers = ["6.2", "6.1", "6.0", "5.7", "5.6"]',
                                       'drivers = ["9.9", "6.1", "6.0", "5.7", "5.6"]')
    broken.write_text(text2)
    with pytest.raises(PolicyError, match="driver 9.9 has no row"):
        load_matrix(str(broken))
