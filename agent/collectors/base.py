"""The collector interface and the isolated runner that turns any collector failure into data.

A collector reads one source through a Host and returns one frozen model. It raises CollectorUnavailable when the
source is simply absent (no AMD GPU, no rpm database); anything else it raises is a broken collector. The runner
records both as a Section, so one collector never aborts a snapshot.
"""

from __future__ import annotations

import enum
import time
from typing import Generic, Optional, Protocol, TypeVar

from agent.errors import CollectorUnavailable, GpuguardError
from agent.host import Host
from agent.log import get_logger
from agent.models import FrozenModel

T = TypeVar("T", bound=FrozenModel)
T_co = TypeVar("T_co", bound=FrozenModel, covariant=True)

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


class Section(FrozenModel, Generic[T]):
    """One collector's outcome: its data, or why there is none."""

    status: Status
    data: Optional[T] = None
    reason: Optional[str] = None


def run_collector(collector: Collector[T], host: Host) -> "Section[T]":
    """Run one collector, turning absence and failure into a Section instead of an exception."""
    started = time.monotonic()
    try:
        data = collector.collect(host)
    except CollectorUnavailable as exc:
        log.debug("collector_absent", collector=collector.name, reason=exc.reason)
        return Section[T](status=Status.ABSENT, reason=exc.reason)
    except GpuguardError as exc:
        log.warning("collector_failed", collector=collector.name, error=str(exc))
        return Section[T](status=Status.ERROR, reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - a broken collector must never abort the snapshot
        log.error("collector_crashed", collector=collector.name, error=f"{type(exc).__name__}: {exc}")
        return Section[T](status=Status.ERROR, reason=f"{type(exc).__name__}: {exc}")
    finally:
        log.debug("collector_done", collector=collector.name,
                  duration_seconds=round(time.monotonic() - started, 4))
    return Section[T](status=Status.OK, data=data)
