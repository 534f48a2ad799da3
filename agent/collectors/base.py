"""The collector interface, the snapshot's data types, and the runner that turns any collector failure into data.

A collector reads one source through a Host and returns one frozen record (agent/frozen.py). It raises
CollectorUnavailable when the source is simply absent (no AMD GPU, no rpm database); anything else it raises is a
broken collector. The runner records both as a Section, so one collector never aborts a snapshot.

The data types are frozen records, not pydantic models: ``gpuguard snapshot`` imports no pydantic (issue #17: its
import alone cost more than the operator's own reads). :func:`as_json_data` turns them into what pydantic's
``model_dump(mode="json")`` gave, byte for byte once printed, so content hashes stay. Where a snapshot is read back
(a file, another process), pydantic validates the same records strictly (agent/snapshot/io.py), with the rules of
:attr:`agent.frozen.Frozen.__pydantic_config__`.
"""

from __future__ import annotations

import datetime as dt
import enum
import time
from typing import Any, Generic, Optional, Protocol, TypeVar

from agent.errors import CollectorUnavailable, GpuguardError
from agent.frozen import Frozen, frozen_record
from agent.host import Host
from agent.log import get_logger

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

log = get_logger("collectors")


class Collector(Protocol[T_co]):
    """Reads one source of facts; ``name`` is the snapshot field it fills."""

    name: str

    def collect(self, host: Host) -> T_co: ...


class Status(str, enum.Enum):
    """How a collector ended."""

    OK = "ok"
    ABSENT = "absent"
    ERROR = "error"


@frozen_record
class Section(Frozen, Generic[T]):
    """One collector's outcome: its data, or why there is none."""

    status: Status
    data: Optional[T] = None
    reason: Optional[str] = None


def json_datetime(value: dt.datetime) -> str:
    """A datetime as pydantic's JSON mode writes it: ISO 8601, UTC as ``Z``."""
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def as_json_data(value: Any) -> Any:
    """A snapshot value as JSON-ready data (dicts, lists, strings, numbers, None): enums by value, datetimes ISO."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or kind is float or value is None:
        return value
    if kind is list or kind is tuple:
        return [as_json_data(item) for item in value]
    if kind is dict:
        return {key: as_json_data(item) for key, item in value.items()}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dt.datetime):
        return json_datetime(value)
    # Fields added after snapshots were stored are left out while empty: a host without the new fact keeps its
    # content hash (tests/snapshot/test_serialization.py).
    omit = getattr(kind, "__json_omit_empty__", ())
    return {name: as_json_data(getattr(value, name)) for name in kind.__record_names__
            if not (omit and name in omit and not getattr(value, name))}


def run_collector(collector: Collector[T], host: Host) -> "Section[T]":
    """Run one collector, turning absence and failure into a Section instead of an exception."""
    started = time.monotonic()
    try:
        data = collector.collect(host)
    except CollectorUnavailable as exc:
        log.debug("collector_absent", collector=collector.name, reason=exc.reason)
        return Section(status=Status.ABSENT, reason=exc.reason)
    except GpuguardError as exc:
        log.warning("collector_failed", collector=collector.name, error=str(exc))
        return Section(status=Status.ERROR, reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - a broken collector must never abort the snapshot
        log.error("collector_crashed", collector=collector.name, error=f"{type(exc).__name__}: {exc}")
        return Section(status=Status.ERROR, reason=f"{type(exc).__name__}: {exc}")
    finally:
        log.debug("collector_done", collector=collector.name,
                  duration_seconds=round(time.monotonic() - started, 4))
    return Section(status=Status.OK, data=data)
