"""Retention: what the bot keeps on disk and in the database, and for how long.

Clones are a cache (rebuilt on demand); a job's source tarball is kept while any active job needs it; stored
webhook payloads are dropped once handled and old, but their delivery ids stay (they are the replay guard).
"""

from __future__ import annotations

import logging
import shutil
import time
from datetime import datetime, timedelta
from pathlib import Path

from bot.context import Context

log = logging.getLogger(__name__)


def _old(path: Path, cutoff_epoch_s: float) -> bool:
    try:
        return path.stat().st_mtime < cutoff_epoch_s
    except FileNotFoundError:
        return False


def collect(ctx: Context, now: datetime) -> dict[str, int]:
    """Remove what retention allows. Returns counts of what was removed."""
    keep_s = ctx.settings.data_retention_hours * 3600
    cutoff = time.time() - keep_s
    removed = {"clones": 0, "sources": 0, "payloads": 0}
    for clone in ctx.clones_dir.glob("*/*"):
        if clone.is_dir() and _old(clone, cutoff):
            shutil.rmtree(clone, ignore_errors=True)
            removed["clones"] += 1
    needed = ctx.store.active_source_paths()
    for tarball in ctx.sources_dir.glob("*/*.tar.gz"):
        if str(tarball) not in needed and _old(tarball, cutoff):
            tarball.unlink(missing_ok=True)
            removed["sources"] += 1
    removed["payloads"] = ctx.store.prune_payloads(now - timedelta(days=ctx.settings.delivery_retention_days))
    if any(removed.values()):
        log.info("retention: removed %s", removed)
    return removed
