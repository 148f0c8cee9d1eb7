"""installation and installation_repositories: which repositories the nightly schedule covers."""

from __future__ import annotations

import logging

from bot.context import Context
from bot.github.routing import Router
from bot.github.webhooks import Event

log = logging.getLogger(__name__)
router = Router()


def _names(repos: list[dict] | None) -> list[str]:
    return [r["full_name"] for r in repos or []]


@router.register("installation", "created")
@router.register("installation", "new_permissions_accepted")
@router.register("installation", "unsuspend")
def installed(ev: Event, ctx: Context) -> None:
    inst = ev.data["installation"]["id"]
    for name in _names(ev.data.get("repositories")):
        ctx.store.upsert_repo(name, inst)
    log.info("installation %s: %d repositories", inst, len(ev.data.get("repositories") or []))


@router.register("installation", "deleted")
@router.register("installation", "suspend")
def uninstalled(ev: Event, ctx: Context) -> None:
    inst = ev.data["installation"]["id"]
    for row in ctx.store.repos():
        if row.installation_id == inst:
            ctx.store.cancel(row.full_name)
            ctx.store.remove_repo(row.full_name)
    log.info("installation %s removed", inst)


@router.register("installation_repositories", "added")
def repos_added(ev: Event, ctx: Context) -> None:
    inst = ev.data["installation"]["id"]
    for name in _names(ev.data.get("repositories_added")):
        ctx.store.upsert_repo(name, inst)


@router.register("installation_repositories", "removed")
def repos_removed(ev: Event, ctx: Context) -> None:
    for name in _names(ev.data.get("repositories_removed")):
        ctx.store.cancel(name)
        ctx.store.remove_repo(name)
