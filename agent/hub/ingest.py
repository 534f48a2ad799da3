"""POST /v1/events, the hot path: a host's EventBatch checked and queued for the group-commit writer.

A request is checked in this order: body size (413, ``middleware.BodySizeLimit``, before anything is parsed),
token (401; 403 for a reader token), JSON syntax (400), schema (422), values no database should hold (422), event
hosts against the token's host (403). The writer's queue full, a write slower than ``write_timeout_seconds`` or a
failing database is 503 with Retry-After, which the agent retries; an event stored before such a failure is
answered as a duplicate then. Events that an alert webhook wants are queued for it before the answer.

FastAPI's route and the direct ASGI path (``Ingest.asgi``) run the same steps and give the same answers.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import re
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from agent.errors import StoreError, WriterBusy
from agent.hub.access import host_of
from agent.hub.alerts import AlertQueue, attention_alerts
from agent.hub.middleware import BodyTooLarge
from agent.hub.responses import (
    HubHTTPError,
    internal_error,
    log_refusal,
    one_line,
    send_error,
    send_json,
    storage_unavailable,
)
from agent.hub.rows import BatchResult, utc, utc_now
from agent.hub.settings import HubSettings
from agent.hub.tokens import Principal, TokenRegistry, bearer_token
from agent.hub.writer import GroupCommitWriter
from agent.log import get_logger
from agent.report.events import EVENT_SCHEMA_VERSION, Event, EventBatch
from agent.validation import validation_problems
from agent.wire import MAX_STORED_INT

log = get_logger("hub.app")


# --- validation beyond the schema ---------------------------------------------------------------------------------

def _unstorable(value: Any, where: str) -> Iterator[str]:
    """Values the schema allows but no database should hold: NUL in text, NaN and infinities, whole numbers
    beyond 64 bits (the schema bounds every serial, count and size it names to 0..MAX_STORED_INT itself)."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _unstorable(getattr(value, name), f"{where} -> {name}")
    elif isinstance(value, str):
        if "\x00" in value:
            yield f"{where}: must not contain NUL (U+0000)"
    elif isinstance(value, float):
        if not math.isfinite(value):
            yield f"{where}: must be a finite number"
    elif isinstance(value, int) and not isinstance(value, bool):
        if not -MAX_STORED_INT <= value <= MAX_STORED_INT:
            yield f"{where}: must be within -{MAX_STORED_INT}..{MAX_STORED_INT} (a 64-bit integer)"
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _unstorable(key, f"{where} (key)")
            yield from _unstorable(item, f"{where} -> {key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value, 1):
            yield from _unstorable(item, f"{where} -> {index}")


# Only a body containing one of these can hold NUL, NaN, an infinity (1e400, or 400 digits) or a whole number beyond
# 64 bits (19 digits or more); others skip the deep walk.
_SUSPECT = re.compile(rb"\\u0000|NaN|Infinity|[0-9][eE][+-]?[0-9]{3}|[0-9]{19}")


def batch_problems(batch: EventBatch, body: Optional[bytes] = None) -> List[str]:
    """What the hub refuses in a schema-valid batch: times without offset or out of range, NUL characters,
    non-finite numbers and whole numbers beyond 64 bits. With the raw ``body``, the walk over every value is
    skipped when the body cannot contain any of them."""
    deep = body is None or _SUSPECT.search(body) is not None
    problems: List[str] = []
    for index, event in enumerate(batch.events, 1):
        where = f"events -> {index}"
        if event.occurred_at.utcoffset() is None:
            problems.append(f"{where} -> occurred_at: needs a UTC offset (RFC 3339), e.g. 2026-01-01T00:00:00Z")
        else:
            try:
                utc(event.occurred_at)
            except OverflowError:
                problems.append(f"{where} -> occurred_at: out of range")
        if deep:
            problems.extend(_unstorable(event, where))
    return problems


def parse_batch(body: bytes) -> EventBatch:
    """The batch in a request body; HubHTTPError 400 for broken JSON, 422 for a body that is not an EventBatch."""
    try:
        batch = EventBatch.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        broken = [e for e in errors if e["type"] == "json_invalid"]
        if broken:
            raise HubHTTPError(400, "malformed_json", f"body is not valid JSON: {broken[0]['msg']}") from None
        problems = validation_problems(errors, top="(body)")
        raise HubHTTPError(422, "schema_invalid", one_line(
            f"body is not an EventBatch (schema v{EVENT_SCHEMA_VERSION})", problems), problems) from None
    problems = batch_problems(batch, body)
    if problems:
        raise HubHTTPError(422, "schema_invalid", one_line("body cannot be stored", problems), problems)
    return batch


class Ingest:
    """POST /v1/events, step by step; the FastAPI route and the direct ASGI path both run these steps."""

    def __init__(self, settings: HubSettings, registry: TokenRegistry, writer: GroupCommitWriter,
                 alerts: Optional[AlertQueue] = None,
                 on_stored: Optional[Callable[[Sequence[Event]], None]] = None,
                 clock: Callable[[], dt.datetime] = utc_now) -> None:
        self.settings = settings
        self.clock = clock  # the hub's clock: when an alert was queued
        self.registry = registry
        self.writer = writer
        self.alerts = alerts
        self.on_stored = on_stored  # told of every stored batch (must not block: the rollout worker's nudge)

    async def store(self, principal: Principal, body: bytes) -> BatchResult:
        """Parse, check the hosts, queue for the writer and wait for the commit."""
        batch = parse_batch(body)
        foreign = sorted({e.host_id for e in batch.events if e.host_id != principal.subject})
        if foreign:
            raise HubHTTPError(403, "forbidden", f"token is for host {principal.subject!r}, not for "
                                                 f"{', '.join(repr(h) for h in foreign[:3])}")
        try:
            future = self.writer.submit(batch.events)
        except WriterBusy as exc:
            raise HubHTTPError(503, "unavailable", str(exc), headers={"Retry-After": "1"}) from None
        timeout = self.settings.write_timeout_seconds
        try:
            result: BatchResult = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except asyncio.TimeoutError:
            raise HubHTTPError(503, "unavailable", f"storing took over {timeout:g} s; retry (stored events are "
                                                   "answered as duplicates)", headers={"Retry-After": "5"}) from None
        except StoreError as exc:
            raise storage_unavailable(exc) from None
        if self.alerts is not None and self.alerts.wanted(batch.events):
            # Queued before the answer: if this fails the agent resends, and the duplicates are queued then.
            try:
                await run_in_threadpool(self.alerts.enqueue, batch.events, self.clock())
            except StoreError as exc:
                raise storage_unavailable(exc) from None
        if self.alerts is not None and self.alerts.webhooks and attention_alerts(batch.events):
            try:  # the same: a policy attention alert is queued (once per key) before the answer
                await run_in_threadpool(self.alerts.enqueue_attention, batch.events, self.clock())
            except StoreError as exc:
                raise storage_unavailable(exc) from None
        if self.on_stored is not None:
            self.on_stored(batch.events)
        log.debug("hub_batch_stored", host_id=principal.subject, accepted_count=len(result.accepted),
                  duplicate_count=len(result.duplicates))
        return result

    async def asgi(self, scope: Dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        """The whole request as plain ASGI: no routing, no dependency injection, no middleware stack (together
        about half of the hub's CPU per report in the bench); same checks in the same order, same answers. Runs
        inside ``BodySizeLimit``, which answers for a body over the limit."""
        try:
            authorization: Optional[bytes] = None
            for name, value in scope["headers"]:
                if name == b"authorization":
                    authorization = value
            principal = host_of(self.registry, bearer_token(authorization.decode("latin-1")) if authorization else None)
            chunks: List[bytes] = []
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return  # the client is gone; nothing to answer
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            result = await self.store(principal, b"".join(chunks))
            await send_json(send, 200, result.model_dump_json().encode())
        except BodyTooLarge:
            raise  # BodySizeLimit, around this handler, answers 413
        except HubHTTPError as exc:
            log_refusal(exc, scope)
            await send_error(send, exc)
        except Exception as exc:  # noqa: BLE001 - answer 500 as the framework would, and log it
            await send_error(send, internal_error(scope.get("path"), exc))
