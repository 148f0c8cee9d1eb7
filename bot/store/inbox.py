"""The webhook inbox: each delivery stored once (its X-GitHub-Delivery id is the primary key, so a replay is
refused by the database), then claimed by the background loop with an expiring claim: a loop that dies while
handling one leaves it to be claimed again. Failed handling is retried with back-off, then marked failed."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from bot.github.webhooks import Event
from bot.store.base import StoreBase, writes
from bot.store.db import Delivery, utcnow


class Inbox(StoreBase):
    @writes
    def record_delivery(self, ev: Event, raw_body: bytes | None = None) -> bool:
        """Store a delivery for the background loop. False when this delivery id was seen before.
        `raw_body`, when given, is stored as received (it is `ev.data` as JSON: no second serialisation)."""
        payload = raw_body.decode() if raw_body is not None else json.dumps(ev.data)
        with self._s() as s:
            s.add(Delivery(id=ev.delivery_id, event=ev.name, action=ev.action, payload=payload))
            try:
                s.commit()
            except IntegrityError:
                s.rollback()
                return False
        return True

    @writes
    def claim_delivery(self, now: datetime | None = None) -> Event | None:
        """Take the oldest pending delivery (or one whose claim lapsed: its processor died)."""
        now = now or utcnow()
        with self._s() as s:
            for _ in range(5):
                row = s.execute(
                    select(Delivery.id)
                    .where(Delivery.status.in_(("pending", "processing")))
                    .where((Delivery.claimed_until.is_(None)) | (Delivery.claimed_until < now))
                    .order_by(Delivery.received_at)
                    .limit(1)
                ).first()
                if row is None:
                    return None
                res = s.execute(
                    update(Delivery)
                    .where(Delivery.id == row.id, Delivery.status.in_(("pending", "processing")))
                    .where((Delivery.claimed_until.is_(None)) | (Delivery.claimed_until < now))
                    .values(status="processing", claimed_until=now + self.claim, attempts=Delivery.attempts + 1)
                )
                s.commit()
                if res.rowcount == 1:
                    d = s.get(Delivery, row.id)
                    assert d is not None
                    return Event(name=d.event, delivery_id=d.id, data=json.loads(d.payload))
        return None

    @writes
    def finish_delivery(self, delivery_id: str, error: str | None = None, now: datetime | None = None) -> None:
        now = now or utcnow()
        with self._s() as s:
            d = s.get(Delivery, delivery_id)
            if d is None:
                return
            if error is None:
                d.status, d.done_at, d.error, d.claimed_until = "done", now, None, None
            elif d.attempts >= self.max_attempts:
                d.status, d.done_at, d.error = "failed", now, error
            else:  # retry later, backing off
                d.status, d.error = "pending", error
                d.claimed_until = now + timedelta(seconds=min(300, 5 * 2**d.attempts))
            s.commit()

    def delivery_status(self, delivery_id: str) -> str | None:
        with self._s() as s:
            d = s.get(Delivery, delivery_id)
            return d.status if d else None

    def delivery_counts(self) -> dict[str, int]:
        with self._s() as s:
            rows = s.execute(select(Delivery.status, func.count()).group_by(Delivery.status)).all()
            return {status: n for status, n in rows}

    @writes
    def prune_payloads(self, before: datetime) -> int:
        """Drop stored payloads of deliveries handled before `before`; the ids stay as the replay guard."""
        with self._s() as s:
            n = s.execute(
                update(Delivery)
                .where(Delivery.status.in_(("done", "failed")), Delivery.done_at < before, Delivery.payload != "")
                .values(payload="")
            ).rowcount
            s.commit()
            return n
