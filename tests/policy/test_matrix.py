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
    """The shipped AMD compatibility matrix loads and has no consistency problem."""
    matrix = load_matrix(str(MATRIX))
    assert matrix.consistency_problems() == []


def test_matrix_covers_rocm_6_0_to_7_x_with_os_kernels_and_gpus() -> None:
    """The matrix has ROCm 6.0 to 7.1, each with OSes, GPUs, drivers and sources, and the known GPU and kernel facts."""
    matrix = load_matrix(str(MATRIX))
    rows = {r.series: r for r in matrix.rocm}
    assert {"6.0", "6.1", "6.2", "6.3", "6.4", "7.0", "7.1"} <= set(rows)
    for row in rows.values():
        assert row.drivers and row.sources
        assert (row.os and row.gpus) or row.series in ("7.14", "10.0")  # TheRock: only AMD's driver table is known
    assert "gfx950" in rows["7.0"].gpus and "gfx950" not in rows["6.4"].gpus
    assert rows["6.3"].kernels["debian:12"] == ["6.1"]


def test_every_source_has_an_address_and_every_table_a_source() -> None:
    """Every source of the matrix has an https address and a place, and every driver row a source."""
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
    assert any(row.example_package for row in matrix.driver), "no example version to check"
    for row in matrix.driver:
        if row.example_package:
            assert series(amdgpu_driver_release(row.example_package)) == row.series


def test_a_broken_matrix_reports_every_problem(tmp_path: Path) -> None:
    """A matrix with a bad date or a driver without a row is a PolicyError saying which."""
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


def test_every_source_is_used_and_every_row_names_one() -> None:
    """Each row cites listed sources; the only source no row cites is AMD's support policy, which covers the whole
    driver table (+/- 2 releases before ROCm 6.4, about a year apart from 6.4 on)."""
    matrix = load_matrix(str(MATRIX))
    used = {s for row in matrix.driver for s in row.sources} | {s for row in matrix.rocm for s in row.sources}
    assert {s.id for s in matrix.sources} - used == {"kernel-space-policy"}
    assert all(row.sources for row in matrix.rocm)


def test_newest_driver_rows_31_x_and_the_version_reporting_change() -> None:
    """31.40 and 31.50 pair with ROCm 7.0-7.2, 7.14 and 10.0; 31.40's row records the 6.19.14 reporting change."""
    matrix = load_matrix(str(MATRIX))
    drivers = {d.series: d for d in matrix.driver}
    for newest in ("31.50", "31.40"):
        assert drivers[newest].rocm == ["7.0", "7.1", "7.2", "7.14", "10.0"]
    row = drivers["31.40"]
    assert row.dkms_base == "6.19.14" and "gpu-operator-1.5.1" in row.sources
    assert any("6.19.14.31400000" in note for note in row.notes)
    # 31.10-31.30 builds exist but AMD's table does not list them: require_amd_matrix refuses them.
    assert not {"31.10", "31.20", "31.30"} & set(drivers)
    assert [d.series for d in matrix.driver][:5] == ["31.50", "31.40", "30.30", "30.20", "30.10"]


@pytest.mark.parametrize("version,release", [
    ("6.19.14.31400000", "31.40.0"),                    # what amd-smi reports from 31.40 on
    ("6.18.8.31200000-2295296", "31.20.0"),              # a 31.20 build seen in the field
    ("1:6.16.13.30300400-2341068.24.04", "30.30.4"),     # 30.30.4, via amdgpu-install 7.2.4
    ("1:6.14.14.30100100-2212064.24.04", "30.10.1"),
    ("1:6.8.5.60202-2041575.22.04", "6.2.2"),
])
def test_release_codes_of_the_30_x_and_31_x_numbering(version: str, release: str) -> None:
    """amdgpu driver package versions map to their release, in the 6.x, 30.x and 31.x numberings."""
    assert amdgpu_driver_release(version) == release


def test_rocm_7_2_row() -> None:
    """ROCm 7.2.x: drivers 30.30 back to 6.4, RHEL 10.1/9.7 added, the same GPU targets as 7.1."""
    matrix = load_matrix(str(MATRIX))
    rows = {r.series: r for r in matrix.rocm}
    row = rows["7.2"]
    assert row.drivers == ["30.30", "30.20", "30.10", "6.4"] and row.releases[-1] == "7.2.3"
    assert row.os["rhel"][:2] == ["10.1", "10.0"] and row.gpus == rows["7.1"].gpus
    assert row.kernels == {} and "rocm-7.2-matrix" in row.sources
    assert matrix.recorded == "2026-12-04"


def test_therock_releases_7_14_and_10_0_are_known_by_their_drivers_and_7_13_is_not() -> None:
    """7.14 and 10.0 have rows with the drivers AMD's driver table lists (31.50 to 30.10) and a note that OS and GPUs
    are not checked; 7.13 is in no table found and has no row."""
    matrix = load_matrix(str(MATRIX))
    rows = {r.series: r for r in matrix.rocm}
    assert "7.13" not in rows and not any("7.13" in d.rocm for d in matrix.driver)
    for name in ("7.14", "10.0"):
        row = rows[name]
        assert row.drivers == ["31.50", "31.40", "30.30", "30.20", "30.10"]
        assert row.os == {} and row.gpus == [] and any("only the driver is checked" in n for n in row.notes)
        assert "therock-packaging" in row.sources


def test_a_row_without_os_or_gpus_must_say_why(tmp_path: Path) -> None:
    """A ROCm row with no os or gpus table and no note is a consistency problem."""
    text = MATRIX.read_text().replace(
        'notes = ["built with TheRock: packages amdrocm-* (amdrocm-base7.14 carries the release), installed under '
        '/opt/rocm/core-7.14",\n         "no OS, kernel or GPU table was found for 7.14: only the driver is checked '
        'against the matrix for this series"]\n', "")
    assert text != MATRIX.read_text()
    path = tmp_path / "matrix.toml"
    path.write_text(text)
    with pytest.raises(PolicyError) as caught:
        load_matrix(str(path))
    rows = load_matrix(str(MATRIX)).rocm
    index = [r.series for r in rows].index("7.14") + 1
    assert f"rocm -> {index}: no os or gpus table and no note saying why" in str(caught.value)


def test_every_row_carries_a_source_url_and_the_day_it_was_checked() -> None:
    """Format 2: each driver and ROCm row names sources that resolve to https URLs and carries its date, never after
    the file's recorded date."""
    matrix = load_matrix(str(MATRIX))
    urls = {s.id: s.url for s in matrix.sources}
    assert matrix.format == 2
    for row in [*matrix.driver, *matrix.rocm]:
        assert row.sources and all(urls[s].startswith("https://") for s in row.sources)
        assert row.date is not None and row.date <= matrix.recorded


def _first_row_changed(old: str, new: str) -> str:
    """The shipped matrix with the first driver row's line ``old`` replaced by ``new``."""
    text = MATRIX.read_text()
    at = text.index("[[driver]]")
    assert old in text[at:]
    return text[:at] + text[at:].replace(old, new, 1)


@pytest.mark.parametrize("old, new, problem", [
    ('date = "2026-12-04"\n', "", "driver -> 1 -> date: required from format 2 (the day the row was checked against "
                                  "its sources)"),
    ('date = "2026-12-04"', 'date = "2026-12-05"', "driver -> 1 -> date: 2026-12-05 is after the matrix's recorded "
                                                   "2026-12-04"),
    ('date = "2026-12-04"', 'date = "2026-13-01"', "driver -> 1 -> date: '2026-13-01' is not a day as "
                                                   "YYYY-MM-DD"),
    ('date = "2026-12-04"', "date = 2026-12-04", "driver -> 1 -> date: datetime.date(2026, 12, 4) is a value of "
                                                 "another type"),
])
def test_a_row_without_its_date_or_with_a_bad_one_is_refused(tmp_path: Path, old: str, new: str,
                                                            problem: str) -> None:
    """A format 2 row without its date, dated after the file's recorded date, or not a day is one problem naming
    the row and the field."""
    broken = tmp_path / "m.toml"
    broken.write_text(_first_row_changed(old, new))
    with pytest.raises(PolicyError) as info:
        load_matrix(str(broken))
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


def test_an_older_format_1_matrix_without_row_dates_still_loads(tmp_path: Path) -> None:
    """An operator's copy in format 1 (rows dated by ``recorded``, no ``date`` per row) loads as before."""
    older = tmp_path / "m.toml"
    older.write_text(MATRIX.read_text().replace("format = 2\n", "format = 1\n", 1).replace('date = "2026-12-04"\n', ""))
    matrix = load_matrix(str(older))
    assert matrix.format == 1 and {row.date for row in [*matrix.driver, *matrix.rocm]} == {None}
