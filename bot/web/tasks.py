"""The bot's background loop (miss-islington's split): the web process only records deliveries; this loop handles
them, requeues expired unit leases (a job whose last unit finished is gathered by the store), keeps check runs
current and ticks the nightly scheduler."""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import datetime
from multiprocessing.connection import Connection
from typing import Any

from bot.context import Context
from bot.features import nightly
from bot.github.routing import Router
from bot.publish.notify import ProgressOutbox, sync_check_runs
from bot.web import retention

log = logging.getLogger(__name__)
RETENTION_INTERVAL_S = 3600.0


class PipeWake:
    """A wake-up signal from the web process to the background process that no crash can deadlock.

    (A multiprocessing.Event shares a lock: a process killed while holding it would block every later `set()`, and
    with it every webhook.) Writes are non-blocking and errors are ignored: a lost wake-up only costs one idle wait.
    """

    def __init__(self, reader: Connection | None = None, writer: Connection | None = None) -> None:
        self._r, self._w = reader, writer
        if writer is not None:
            os.set_blocking(writer.fileno(), False)

    def set(self) -> None:
        if self._w is not None:
            try:
                os.write(self._w.fileno(), b"\0")
            except OSError:  # full (a wake-up is pending anyway) or the reader is gone
                pass

    def wait(self, timeout: float) -> bool:
        if self._r is None:
            time.sleep(timeout)
            return False
        return self._r.poll(timeout)

    def clear(self) -> None:
        if self._r is None:
            return
        fd = self._r.fileno()
        os.set_blocking(fd, False)
        try:
            while os.read(fd, 65536):
                pass
        except OSError:
            pass


class Background:
    def __init__(
        self,
        ctx: Context,
        router: Router,
        *,
        idle_seconds: float = 0.5,
        stop: Any = None,
        parent_pid: int | None = None,
    ) -> None:
        self.ctx = ctx
        self.router = router
        self.idle_seconds = idle_seconds
        self._stop = stop if stop is not None else threading.Event()
        self._parent_pid = parent_pid  # in a child process: stop when the web process is gone
        self._thread: threading.Thread | None = None
        self._last_tick = 0.0
        self._sync_after = 0.0
        self._next_retention = 0.0
        self._sync_failures = 0
        self._backfilled = False
        self.progress = ProgressOutbox()

    def handle_one(self, now: datetime | None = None) -> bool:
        """Handle the next pending delivery. False when there was none."""
        ev = self.ctx.store.claim_delivery(now)
        if ev is None:
            return False
        try:
            self.router.dispatch(ev, self.ctx)
        except Exception as e:  # a broken GitHub or disk: retried with backoff, then marked failed
            log.exception("delivery %s (%s.%s) failed", ev.delivery_id, ev.name, ev.action)
            self.ctx.store.finish_delivery(ev.delivery_id, error=f"{type(e).__name__}: {e}"[:2000])
            self.ctx.metrics.processed.labels("error").inc()
        else:
            self.ctx.store.finish_delivery(ev.delivery_id)
            self.ctx.metrics.processed.labels("ok").inc()
        return True

    def housekeeping(self, now: datetime | None = None) -> None:
        now = now or self.ctx.store.clock()
        if not self._backfilled:  # once per process: jobs queued by a bot from before units
            self.ctx.store.backfill_units()
            self._backfilled = True
        self.ctx.store.requeue_expired(now)
        if time.monotonic() >= self._sync_after:
            try:
                sync_check_runs(self.ctx, progress=self.progress)
                self.progress.sync(self.ctx)
                self._sync_failures = 0
            except Exception as e:  # GitHub unreachable: back off, the outbox keeps the updates
                self._sync_failures += 1
                delay_s = min(300.0, 2.0**self._sync_failures)
                self._sync_after = time.monotonic() + delay_s
                log.warning("check run updates failed (%s); retrying in %.0f s", e, delay_s)
        if time.monotonic() >= self._next_retention:
            self._next_retention = time.monotonic() + RETENTION_INTERVAL_S
            try:
                retention.collect(self.ctx, now)
            except Exception:
                log.exception("retention pass failed")
        if time.monotonic() - self._last_tick >= self.ctx.settings.scheduler_interval_seconds:
            self._last_tick = time.monotonic()
            if nightly.tick(self.ctx.store, now):
                self.ctx.wake.set()

    def drain(self, max_items: int = 10_000) -> int:
        """Handle everything pending, then housekeeping (tests and the single-shot path use this)."""
        n = 0
        while n < max_items and self.handle_one():
            n += 1
        self.housekeeping()
        return n

    def _orphaned(self) -> bool:
        return self._parent_pid is not None and os.getppid() != self._parent_pid

    def run(self) -> None:
        log.info("background loop started")
        while not self._stop.is_set() and not self._orphaned():
            try:
                busy = False
                for _ in range(50):
                    if self._stop.is_set() or not self.handle_one():
                        break
                    busy = True
                self.housekeeping()
            except Exception:
                log.exception("background loop error")
                busy = False
            if not busy:
                self.ctx.wake.wait(self.idle_seconds)
                self.ctx.wake.clear()
        log.info("background loop stopped")

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="fusebot-background", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_seconds: float = 10.0) -> None:
        self._stop.set()
        self.ctx.wake.set()
        if self._thread is not None:
            self._thread.join(timeout_seconds)
