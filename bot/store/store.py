"""`Store`: the bot's whole database, put together from its parts."""

from __future__ import annotations

from bot.store.base import StoreBase
from bot.store.inbox import Inbox
from bot.store.jobs import Jobs
from bot.store.repos import Repos


class Store(Inbox, Repos, Jobs, StoreBase):
    """The webhook inbox (bot/store/inbox.py), installed repositories (bot/store/repos.py) and jobs
    (bot/store/jobs.py), on SQLite or PostgreSQL (bot/store/db.py)."""
