"""The snapshot's frozen records: value equality, hash, repr, immutability, and the JSON-ready form."""

from __future__ import annotations

import datetime as dt

import pytest

from agent.collectors.base import Section, Status, as_json_data, json_datetime
from agent.collectors.containers import ContainerTool
from agent.collectors.cuda import CudaToolkit
from agent.collectors.rocm import RocmInstall
from agent.frozen import FrozenInstanceError, replace


def test_equal_by_type_and_values() -> None:
    """Same type and values: equal with one hash; another type with the same field values is not equal."""
    a, b = RocmInstall(path="/opt/rocm-6.2.2", version="6.2.2"), RocmInstall(path="/opt/rocm-6.2.2", version="6.2.2")
    assert a == b and hash(a) == hash(b) and not (a != b)
    assert a != RocmInstall(path="/opt/rocm-6.2.2", version="6.2.3")
    assert ContainerTool(path="/x", version="1") != RocmInstall(path="/x", version="1")
    assert CudaToolkit(path="/x") != RocmInstall(path="/x")


def test_repr_names_every_field() -> None:
    """The repr reads like a dataclass's: the class and every field."""
    assert repr(RocmInstall(path="/opt/rocm", version=None)) == \
        "RocmInstall(path='/opt/rocm', version=None, amd_smi_soname=None, version_source=None, header_version=None)"


def test_fields_cannot_be_assigned() -> None:
    """Frozen: assignment raises, ``replace`` makes a changed copy."""
    install = RocmInstall(path="/opt/rocm")
    with pytest.raises(FrozenInstanceError):
        install.version = "7.0"  # type: ignore[misc]
    assert replace(install, version="7.0").version == "7.0" and install.version is None


def test_json_data_is_what_pydantic_json_mode_gave() -> None:
    """Enums by value, nested records as dicts with every field (None kept), datetimes in ISO with Z for UTC."""
    section = Section(status=Status.OK, data=ContainerTool(path="/usr/bin/docker"))
    assert as_json_data(section) == {"status": "ok", "data": {"path": "/usr/bin/docker", "version": None},
                                     "reason": None}
    utc = dt.datetime(2026, 1, 2, 3, 4, 5, 600, tzinfo=dt.timezone.utc)
    assert json_datetime(utc) == "2026-01-02T03:04:05.000600Z"
    assert json_datetime(utc.astimezone(dt.timezone(dt.timedelta(hours=2)))) == "2026-01-02T05:04:05.000600+02:00"
    assert json_datetime(utc.replace(tzinfo=None, microsecond=0)) == "2026-01-02T03:04:05"
