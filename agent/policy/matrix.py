"""AMD's published compatibility matrix as data (policies/amd-compat-matrix.toml): model, loader, checks.

``require_amd_matrix = true`` in a policy makes the resulting driver/ROCm/OS/kernel/GPU combination subject to
this matrix; ``gpuguard policy compile`` embeds the needed subset in the compiled policy so the apt hook never
parses TOML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from pydantic import ConfigDict, Field, ValidationError, field_validator

from agent.errors import InputFileError, PolicyError
from agent.files import decode_text, read_bytes_bounded
from agent.models import FrozenModel
from agent.tomlreader import MAX_TOML_BYTES, toml_module, toml_worded
from agent.validation import iso_day, validation_problems

MATRIX_FILE_NAME = "amd-compat-matrix.toml"
# The matrix format from which every row carries the day it was checked (``date``).
DATED_ROWS_FORMAT = 2
# Where the matrix is looked for, in order, when no path is configured: operator copy, packaged copy, source tree.
MATRIX_SEARCH_PATHS = ("/etc/gpuguard/" + MATRIX_FILE_NAME, "/usr/share/gpuguard/" + MATRIX_FILE_NAME,
                       str(Path(__file__).resolve().parents[2] / "policies" / MATRIX_FILE_NAME))


def _row_day(value: Optional[str]) -> Optional[str]:
    return value if value is None else iso_day(value)


def _series(value: str) -> str:
    parts = value.split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{value!r} is not a MAJOR.MINOR series")
    return value


class MatrixModel(FrozenModel):
    """A matrix table: frozen, unknown keys refused, and strict (no string or float or boolean for a number)."""

    model_config = ConfigDict(**FrozenModel.model_config, strict=True)


class Source(MatrixModel):
    """Where a table came from."""

    id: str = Field(min_length=1)
    where: str = Field(min_length=1)
    url: str = Field(pattern=r"^https://")
    what: str = Field(min_length=1)


class DriverRow(MatrixModel):
    """One amdgpu driver series and the ROCm series AMD supports on it."""

    series: str
    # The day the row was checked against its sources (required from format 2; a format 1 row is dated by the
    # file's ``recorded``).
    date: Optional[str] = None
    rocm: List[str] = Field(min_length=1)
    dkms_base: Optional[str] = None
    example_package: Optional[str] = None
    sources: List[str] = Field(min_length=1)
    notes: List[str] = []

    _check_series = field_validator("series")(_series)
    _check_date = field_validator("date")(_row_day)

    @field_validator("rocm")
    @classmethod
    def _rocm_series(cls, value: List[str]) -> List[str]:
        for item in value:
            _series(item)
        return value


class RocmRow(MatrixModel):
    """One ROCm series: the drivers, OS releases, kernel series and GPU targets AMD lists for it."""

    series: str
    date: Optional[str] = None  # as DriverRow's
    releases: List[str] = Field(min_length=1)
    drivers: List[str] = Field(min_length=1)
    gpus: List[str] = []  # empty: AMD's table for the series was not found, GPUs are not checked (notes say so)
    os: Dict[str, List[str]] = {}  # empty: likewise for OS releases
    kernels: Dict[str, List[str]] = {}
    sources: List[str] = Field(min_length=1)
    notes: List[str] = []

    _check_series = field_validator("series")(_series)
    _check_date = field_validator("date")(_row_day)

    @field_validator("gpus")
    @classmethod
    def _gfx(cls, value: List[str]) -> List[str]:
        for item in value:
            if not item.startswith("gfx") or not item[3:].isalnum():
                raise ValueError(f"{item!r} is not a gfx target")
        return value


class Matrix(MatrixModel):
    """The whole matrix file."""

    # 2: every row carries its ``date``; 1 (an older copy): rows are dated by ``recorded``.
    format: int = Field(ge=1, le=DATED_ROWS_FORMAT)
    title: str
    recorded: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    sources: List[Source] = Field(min_length=1)
    driver: List[DriverRow] = Field(min_length=1)
    rocm: List[RocmRow] = Field(min_length=1)

    def consistency_problems(self) -> List[str]:
        """Cross-table problems: unknown sources, duplicate rows, drivers the driver table contradicts."""
        problems = []
        source_ids = {s.id for s in self.sources}
        drivers = {d.series: d for d in self.driver}
        if len(drivers) != len(self.driver):
            problems.append("driver: duplicate series")
        if len({r.series for r in self.rocm}) != len(self.rocm):
            problems.append("rocm: duplicate series")
        tables: List[Tuple[str, Sequence[Union[DriverRow, RocmRow]]]] = [("driver", self.driver), ("rocm", self.rocm)]
        for table, rows in tables:
            for i, dated in enumerate(rows, 1):
                if dated.date is None and self.format >= DATED_ROWS_FORMAT:
                    problems.append(f"{table} -> {i} -> date: required from format {DATED_ROWS_FORMAT} (the day the "
                                    f"row was checked against its sources)")
                elif dated.date is not None and dated.date > self.recorded:
                    problems.append(f"{table} -> {i} -> date: {dated.date} is after the matrix's recorded "
                                    f"{self.recorded}")
        for i, row in enumerate(self.driver, 1):
            problems += [f"driver -> {i}: unknown source {s!r}" for s in row.sources if s not in source_ids]
        for i, rocm_row in enumerate(self.rocm, 1):
            problems += [f"rocm -> {i}: unknown source {s!r}" for s in rocm_row.sources if s not in source_ids]
            problems += [f"rocm -> {i}: release {r} is not in series {rocm_row.series}" for r in rocm_row.releases
                         if not r.startswith(rocm_row.series + ".")]
            for d in rocm_row.drivers:
                if d not in drivers:
                    problems.append(f"rocm -> {i}: driver {d} has no row in the driver table")
                elif rocm_row.series not in drivers[d].rocm:
                    problems.append(f"rocm -> {i}: ROCm {rocm_row.series} lists driver {d}, but the driver table "
                                    f"does not list ROCm {rocm_row.series} for it")
            if (not rocm_row.os or not rocm_row.gpus) and not rocm_row.notes:
                problems.append(f"rocm -> {i}: no os or gpus table and no note saying why")
            for key in rocm_row.kernels:
                os_id, _, version = key.partition(":")
                if os_id not in rocm_row.os or not version:
                    problems.append(f"rocm -> {i}: kernels key {key!r} names no OS of this row")
        return problems

    def to_compiled(self) -> dict:
        """The subset the evaluator uses, as plain JSON data."""
        return {
            "recorded": self.recorded,
            "driver_rocm": {d.series: list(d.rocm) for d in self.driver},
            "rocm": {r.series: {"os": {k: list(v) for k, v in r.os.items()},
                                "kernels": {k: list(v) for k, v in r.kernels.items()},
                                "gpus": list(r.gpus)} for r in self.rocm},
        }


def find_matrix_file(explicit: Optional[str] = None) -> str:
    """The matrix file to use: ``explicit`` or the first of MATRIX_SEARCH_PATHS that exists."""
    if explicit:
        return explicit
    for candidate in MATRIX_SEARCH_PATHS:
        if Path(candidate).is_file():
            return candidate
    raise PolicyError(MATRIX_FILE_NAME, [f"not found in {', '.join(MATRIX_SEARCH_PATHS)}"])


def load_matrix(path: Optional[str] = None) -> Matrix:
    """Read and validate the matrix; PolicyError lists every problem."""
    where = find_matrix_file(path)
    tomllib = toml_module()
    try:  # never blocks (a FIFO or a device in place of the file) and never reads past the cap
        data = tomllib.loads(decode_text(where, read_bytes_bounded(where, MAX_TOML_BYTES)))
    except InputFileError as exc:
        raise PolicyError(where, [exc.reason]) from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(where, [f"not valid TOML: {exc}"]) from None
    except RecursionError:
        raise PolicyError(where, ["not valid TOML: nested too deeply"]) from None
    try:
        matrix = Matrix.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(where, validation_problems([toml_worded(e) for e in exc.errors()])) from None
    problems = matrix.consistency_problems()
    if problems:
        raise PolicyError(where, problems)
    return matrix
