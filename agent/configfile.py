"""Reading a TOML settings file into one pydantic model: the part of agent/config.py every command shares.

Kept apart from agent/config.py so a command that needs one section (``gpuguard snapshot`` reads only
``[snapshot]``) validates that section's model and does not import every area's settings.
"""

from __future__ import annotations

import sys
from typing import Type, TypeVar

from pydantic import ValidationError

from agent.errors import ConfigError, InputFileError
from agent.files import FileMissing, decode_text, read_bytes_bounded
from agent.models import FrozenModel, validation_problems
from agent.strictjson import MAX_NESTING_DEPTH, nesting_depth

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 hosts
    import tomli as tomllib

M = TypeVar("M", bound=FrozenModel)


def parse_toml_model(text: str, path: str, model: Type[M]) -> M:
    """Parse TOML text into a settings model; ConfigError lists every problem (bad TOML or every bad field)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, [f"not valid TOML: {exc}"]) from None
    except RecursionError:
        raise ConfigError(path, ["not valid TOML: nested too deeply"]) from None
    if nesting_depth(data) > MAX_NESTING_DEPTH:
        raise ConfigError(path, [f"not valid TOML: nested deeper than {MAX_NESTING_DEPTH} levels"])
    try:
        return model.model_validate(data)
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
