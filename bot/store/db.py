"""Tables and engine. SQLite file by default, PostgreSQL by URL; SQLAlchemy 2.0 typed declarative models.

Four tables: `deliveries` (the inbox: each webhook or internal event once, keyed by X-GitHub-Delivery), `jobs` (what
a trigger asked for, and its gathered result), `units` (what runners lease: one per target of a search job, one for a
benchmark or hygiene job) and `repos` (installed repositories and their schedule).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Engine,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    inspect,
    text,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
from sqlalchemy.types import TypeDecorator

JOB_STATES = ("queued", "leased", "running", "succeeded", "failed", "cancelled")
ACTIVE_STATES = ("queued", "leased", "running")
TERMINAL_STATES = ("succeeded", "failed", "cancelled")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, on SQLite (which drops the zone) and PostgreSQL alike."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    pass


class Delivery(Base):
    __tablename__ = "deliveries"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)  # X-GitHub-Delivery or "schedule:..."
    event: Mapped[str] = mapped_column(String(100))
    action: Mapped[str | None] = mapped_column(String(100))
    payload: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(20), default="pending")  # pending, processing, done, failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    error: Mapped[str | None] = mapped_column(Text)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    done_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_deliveries_status_received", "status", "received_at"),)


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    dedupe_key: Mapped[str] = mapped_column(String(300), unique=True)
    repo: Mapped[str] = mapped_column(String(200))
    installation_id: Mapped[int | None] = mapped_column(BigInteger)
    sha: Mapped[str] = mapped_column(String(64))
    pr_number: Mapped[int | None] = mapped_column(Integer)
    trigger: Mapped[str] = mapped_column(String(20))
    state: Mapped[str] = mapped_column(String(20), default="queued")
    spec: Mapped[str] = mapped_column(Text)  # runner.contract.Job as JSON
    source_path: Mapped[str | None] = mapped_column(Text)
    lease_hash: Mapped[str | None] = mapped_column(String(64))
    leased_by: Mapped[str | None] = mapped_column(String(100))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    retry_note: Mapped[str | None] = mapped_column(Text)  # its units' latest "attempt 2 of 3: ..." (see UnitRow)
    progress: Mapped[str | None] = mapped_column(Text)
    result: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    check_run_id: Mapped[int | None] = mapped_column(BigInteger)
    notified_state: Mapped[str | None] = mapped_column(String(20))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_jobs_state_created", "state", "created_at"),
        Index("ix_jobs_repo_pr", "repo", "pr_number"),
    )


class UnitRow(Base):
    """One target of a job (or the whole of a one-target, benchmark or hygiene job: then its id is the job's)."""

    __tablename__ = "units"

    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(64))
    idx: Mapped[int] = mapped_column(Integer)  # the target's place in the job: the gathered result keeps this order
    repo: Mapped[str] = mapped_column(String(200))
    target: Mapped[str] = mapped_column(String(300), default="")
    state: Mapped[str] = mapped_column(String(20), default="queued")
    spec: Mapped[str] = mapped_column(Text)  # runner.contract.Job as JSON: the job narrowed to this unit's target
    lease_hash: Mapped[str | None] = mapped_column(String(64))
    leased_by: Mapped[str | None] = mapped_column(String(100))
    leased_at: Mapped[datetime | None] = mapped_column(UTCDateTime())  # the last lease: round-robin over repositories
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # why the unit went back to the queue, for its next attempt: "attempt 2 of 3: the previous worker stopped answering"
    retry_note: Mapped[str | None] = mapped_column(Text)
    progress: Mapped[str | None] = mapped_column(Text)
    result: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("job_id", "idx", name="uq_units_job_idx"),
        Index("ix_units_state_created", "state", "created_at"),
        Index("ix_units_repo_leased", "repo", "leased_at"),
    )


class RepoRow(Base):
    __tablename__ = "repos"

    full_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    installation_id: Mapped[int] = mapped_column(BigInteger)
    schedule_enabled: Mapped[bool] = mapped_column(default=True)
    cron: Mapped[str] = mapped_column(String(100), default="0 3 * * *")
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    next_run_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def add_missing_columns(engine: Engine) -> list[str]:
    """Columns added to a table after a database was created (nullable, so they need no value): added in place, so
    a bot upgraded over its old database keeps its queue. Returns the `table.column`s added (another process
    starting at once may add some of them first: those are not errors)."""
    added = []
    for table in Base.metadata.sorted_tables:
        present = {c["name"] for c in inspect(engine).get_columns(table.name)}
        for col in table.columns:
            if col.name in present or not col.nullable:
                continue
            kind = col.type.compile(dialect=engine.dialect)
            try:
                with engine.begin() as conn:
                    conn.execute(text(f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {kind}'))
            except DBAPIError:
                if col.name not in {c["name"] for c in inspect(engine).get_columns(table.name)}:
                    raise
                continue
            added.append(f"{table.name}.{col.name}")
    return added


def init_db(url: str) -> sessionmaker:
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    add_missing_columns(engine)
    return sessionmaker(engine, expire_on_commit=False)
