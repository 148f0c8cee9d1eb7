"""Installed repositories and their nightly schedule."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from bot.store.base import StoreBase, writes
from bot.store.db import RepoRow


class Repos(StoreBase):
    @writes
    def upsert_repo(self, full_name: str, installation_id: int) -> None:
        with self._s() as s:
            row = s.get(RepoRow, full_name)
            if row is None:
                s.add(RepoRow(full_name=full_name, installation_id=installation_id))
            else:
                row.installation_id = installation_id
            try:
                s.commit()
            except IntegrityError:  # added concurrently: fine
                s.rollback()

    @writes
    def remove_repo(self, full_name: str) -> None:
        with self._s() as s:
            row = s.get(RepoRow, full_name)
            if row is not None:
                s.delete(row)
                s.commit()

    def repos(self) -> list[RepoRow]:
        with self._s() as s:
            return list(s.scalars(select(RepoRow).order_by(RepoRow.full_name)))

    @writes
    def set_schedule(
        self, full_name: str, *, enabled: bool, cron: str, timezone: str, next_run_at: datetime | None
    ) -> None:
        with self._s() as s:
            row = s.get(RepoRow, full_name)
            if row is None:
                return
            row.schedule_enabled, row.cron, row.timezone, row.next_run_at = enabled, cron, timezone, next_run_at
            s.commit()

    @writes
    def advance_schedule(self, full_name: str, expected: datetime | None, next_run_at: datetime) -> bool:
        """Move a repository's next run from `expected` to `next_run_at`; False when another process did it."""
        with self._s() as s:
            cond = RepoRow.next_run_at.is_(None) if expected is None else RepoRow.next_run_at == expected
            res = s.execute(
                update(RepoRow).where(RepoRow.full_name == full_name, cond).values(next_run_at=next_run_at)
            )
            s.commit()
            return res.rowcount == 1
