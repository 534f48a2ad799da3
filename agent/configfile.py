"""Reading a TOML settings file: the part of agent/config.py every command shares.

Kept apart from agent/config.py so a command that needs one section (``gpuguard snapshot`` reads only
``[snapshot]``) checks that section and does not import every area's settings. Most sections are pydantic models
(:func:`parse_toml_model`); a section that a pydantic-free command reads (``[snapshot]``) is a frozen record
(agent/frozen.py) whose rules :func:`check_section` applies, on that command directly and inside the daemon's pydantic
Settings through :func:`section_core_schema`: one declaration, one set of rules, the same ``file: section -> field:
message`` lines.
"""

from __future__ import annotations

import math
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)

from agent.errors import ConfigError, InputFileError
from agent.files import FileMissing, decode_text, read_bytes_bounded
from agent.frozen import field_values, record_fields
from agent.strictjson import MAX_NESTING_DEPTH, nesting_depth
from agent.tomlreader import toml_module
from agent.validation import validation_problems

if TYPE_CHECKING:  # pragma: no cover - pydantic is imported only where a pydantic model is validated
    from pydantic_core import CoreSchema

    from agent.models import FrozenModel

M = TypeVar("M", bound="FrozenModel")
D = TypeVar("D")
Location = Tuple[Union[str, int], ...]


def parse_toml(text: str, path: str) -> Dict[str, Any]:
    """Parse TOML text; ConfigError for text that is not TOML or nests too deeply."""
    tomllib = toml_module()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, [f"not valid TOML: {exc}"]) from None
    except RecursionError:
        raise ConfigError(path, ["not valid TOML: nested too deeply"]) from None
    if nesting_depth(data) > MAX_NESTING_DEPTH:
        raise ConfigError(path, [f"not valid TOML: nested deeper than {MAX_NESTING_DEPTH} levels"])
    return data


def parse_toml_model(text: str, path: str, model: Type[M]) -> M:
    """Parse TOML text into a settings model; ConfigError lists every problem (bad TOML or every bad field)."""
    from pydantic import ValidationError

    data = parse_toml(text, path)
    try:
        return model.model_validate(data, context={"path": path})  # a model's warnings name the file
    except ValidationError as exc:
        raise ConfigError(path, validation_problems(exc.errors())) from None


def read_config_text(path: str, required: bool = False) -> "str | None":
    """The file's text; None when it does not exist (unless ``required``); ConfigError when it cannot be read."""
    try:
        raw = read_bytes_bounded(path)
    except FileMissing:
        if required:
            raise ConfigError(path, ["no such file"]) from None
        return None
    except InputFileError as exc:
        raise ConfigError(path, [exc.reason]) from None
    try:
        return decode_text(path, raw)
    except InputFileError as exc:
        raise ConfigError(path, [exc.reason]) from None


# --- record sections ---------------------------------------------------------------------------------------------


class SectionInvalid(Exception):
    """Every problem of one settings section: (location inside the section, message) pairs."""

    def __init__(self, problems: Sequence[Tuple[Location, str]]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(f"{loc}: {msg}" for loc, msg in self.problems))

    def errors(self, prefix: Location = ()) -> List[Dict[str, Any]]:
        """The problems as pydantic-style error dicts (``loc``, ``msg``), located under ``prefix``."""
        return [{"loc": (*prefix, *loc), "msg": msg} for loc, msg in self.problems]


def _number(value: object, loc: Location, problems: List[Tuple[Location, str]]) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        problems.append((loc, "Input should be a valid number"))
        return None
    if not math.isfinite(value):
        problems.append((loc, "Input should be a finite number"))
        return None
    return float(value)


def _string_list(value: object, loc: Location, problems: List[Tuple[Location, str]]) -> Optional[List[str]]:
    if not isinstance(value, list):
        problems.append((loc, "Input should be a valid list"))
        return None
    bad = [((*loc, i), "Input should be a valid string") for i, item in enumerate(value) if not isinstance(item, str)]
    problems.extend(bad)
    return None if bad else list(value)


# The field types a record section may declare (its annotation, as written), and how each is checked.
_KINDS: Dict[str, Callable[[object, Location, List[Tuple[Location, str]]], Any]] = {
    "float": _number,
    "List[str]": _string_list,
}


def check_section(cls: Type[D], data: object) -> D:
    """A record section from a TOML table: every field checked by its declared type and ``metadata``.

    Unknown keys are refused; ``metadata={"gt": N}`` on a number field requires more than N. SectionInvalid lists
    every problem. An instance of ``cls`` is returned as it is (a default already in a pydantic model).
    """
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise SectionInvalid([((), f"Input should be a valid dictionary or instance of {cls.__name__}")])
    declared = {spec.name: spec for spec in record_fields(cls)}
    problems: List[Tuple[Location, str]] = [((key,), "Extra inputs are not permitted")
                                            for key in data if key not in declared]
    values: Dict[str, Any] = {}
    for name, value in data.items():
        spec = declared.get(name)
        if spec is None:
            continue
        checked = _KINDS[spec.annotation](value, (name,), problems)
        if checked is None:
            continue
        floor = spec.metadata.get("gt")
        if floor is not None and not checked > floor:
            problems.append(((name,), f"Input should be greater than {floor}"))
            continue
        values[name] = checked
    if problems:
        raise SectionInvalid(problems)
    return cls(**values)


def section_core_schema(cls: type) -> "CoreSchema":
    """How a pydantic model validates a record section field: :func:`check_section`, problems kept by field.

    For the section's ``__get_pydantic_core_schema__``; imports pydantic only when a pydantic model is built.
    """
    from pydantic_core import PydanticCustomError, ValidationError, core_schema

    def validate(value: object) -> object:
        try:
            return check_section(cls, value)
        except SectionInvalid as exc:
            raise ValidationError.from_exception_data(cls.__name__, [
                {"type": PydanticCustomError("invalid_setting", msg), "loc": loc, "input": value}
                for loc, msg in exc.problems]) from None

    # Dumped as its fields: the settings handed to a job child (``model_dump``) and ``gpuguard`` JSON output.
    return core_schema.no_info_plain_validator_function(
        validate, serialization=core_schema.plain_serializer_function_ser_schema(field_values))
