"""Group commit: request handlers hand batches to one writer thread, which stores whatever has queued up in one
transaction and answers each batch's future.

Under load many batches share one commit (and one fsync); when idle a batch is committed alone at once. When a
shared commit fails, each of its batches is committed again alone, so a batch the database refuses fails by itself
and never takes other hosts' batches down with it. The queue
is bounded: when it is full ``submit`` raises WriterBusy and the hub answers 503, so the agent retries later
instead of the hub growing without bound.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import queue
import threading
import time
from typing import Callable, List, Optional, Sequence

from agent.errors import WriterBusy
from agent.hub.rows import BatchResult, utc_now
from agent.hub.store import Store
from agent.log import get_logger
from agent.report.events import Event

log = get_logger("hub.writer")


class _PendingBatch:
    __slots__ = ("events", "future")

    def __init__(self, events: Sequence[Event]) -> None:
        self.events = events
        self.future: "concurrent.futures.Future[BatchResult]" = concurrent.futures.Future()


_STOP = object()


class GroupCommitWriter:
    """One thread that owns all writes to the store."""

    def __init__(self, store: Store, max_pending_batches: int = 10_000, max_events_per_commit: int = 5_000,
                 clock: Callable[[], dt.datetime] = utc_now) -> None:
        self._store = store
        self._max_events_per_commit = max_events_per_commit
        self._clock = clock
        self._queue: "queue.Queue[object]" = queue.Queue(maxsize=max_pending_batches)
        self._closed = False
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self.commit_count = 0
        self.batch_count = 0

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._closed = False
            self._thread = threading.Thread(target=self._run, name="hub-writer", daemon=True)
            self._thread.start()

    def submit(self, events: Sequence[Event]) -> "concurrent.futures.Future[BatchResult]":
        """Queue one batch; the future gives its BatchResult or the StoreError that stopped it."""
        job = _PendingBatch(events)
        with self._lock:
            if self._closed or self._thread is None:
                raise WriterBusy("hub is not accepting writes (starting or shutting down)")
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                raise WriterBusy("too many batches waiting to be stored") from None
        return job.future

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Store what is queued, then end the thread (waiting at most ``timeout_seconds``)."""
        with self._lock:
            if self._thread is None or self._closed:
                return
            self._closed = True
            thread = self._thread
        deadline = time.monotonic() + timeout_seconds
        while True:  # the queue may be full: wait for room for the stop mark, within the timeout
            try:
                self._queue.put(_STOP, timeout=max(0.01, deadline - time.monotonic()))
                break
            except queue.Full:
                if time.monotonic() >= deadline:
                    log.error("hub_writer_stop_timeout", pending_batches=self._queue.qsize())
                    return
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            log.error("hub_writer_stop_timeout", pending_batches=self._queue.qsize())
        with self._lock:
            self._thread = None
        log.info("hub_writer_stopped", commit_count=self.commit_count, batch_count=self.batch_count)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            group: List[_PendingBatch] = [item]  # type: ignore[list-item]
            event_count = len(group[0].events)
            stop_after = False
            while event_count < self._max_events_per_commit:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop_after = True
                    break
                group.append(item)  # type: ignore[arg-type]
                event_count += len(item.events)  # type: ignore[attr-defined]
            self._commit(group)
            if stop_after:
                return

    def _commit(self, group: List[_PendingBatch]) -> None:
        live = [job for job in group if job.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            results = self._store.ingest([job.events for job in live], received_at=self._clock())
        except Exception as exc:  # noqa: BLE001 - every waiting request must hear of the failure
            log.error("hub_commit_failed", batch_count=len(live), error=str(exc))
            if len(live) == 1:
                live[0].future.set_exception(exc)
                return
            # One host's batch that the database refuses must not take the others down with it: each batch of the
            # failed commit is committed alone (the whole commit was rolled back), so only the bad one fails.
            for job in live:
                self._commit_alone(job)
            return
        self.commit_count += 1
        self.batch_count += len(live)
        for job, result in zip(live, results):
            job.future.set_result(result)

    def _commit_alone(self, job: _PendingBatch) -> None:
        try:
            (result,) = self._store.ingest([job.events], received_at=self._clock())
        except Exception as exc:  # noqa: BLE001 - the waiting request must hear of the failure
            log.error("hub_commit_failed", batch_count=1, error=str(exc))
            job.future.set_exception(exc)
            return
        self.commit_count += 1
        self.batch_count += 1
        job.future.set_result(result)
