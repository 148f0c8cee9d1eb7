"""`Store`: the bot's whole database, put together from its parts."""

from __future__ import annotations

from bot.store.base import StoreBase
from bot.store.inbox import Inbox
from bot.store.jobs import Jobs
from bot.store.repos import Repos
from bot.store.units import Units


class Store(Inbox, Repos, Units, Jobs, StoreBase):
    """The webhook inbox (bot/store/inbox.py), installed repositories (bot/store/repos.py), jobs (bot/store/jobs.py)
    and the units runners lease (bot/store/units.py), on SQLite or PostgreSQL (bot/store/db.py)."""
