"""pull_request events: the trigger label, new commits on a labelled PR, config changes, closed PRs."""

from __future__ import annotations

import logging

from bot.context import Context
from bot.features.triggers import start_job, validate_config
from bot.github import client
from bot.github.routing import Router
from bot.github.webhooks import Event
from bot.repo.config import CONFIG_PATH, ConfigError, load_config

log = logging.getLogger(__name__)
router = Router()


def trigger_label(ctx: Context, repo: str, installation_id: int, ref: str) -> str:
    """The repository's trigger label, from its config at `ref` (the PR's base), else the bot's default."""
    text = client.file_text(ctx.gh(installation_id), repo, CONFIG_PATH, ref)
    try:
        return load_config(text).trigger_label
    except ConfigError:
        return ctx.settings.trigger_label


def _pr_fields(ev: Event) -> tuple[str, int, dict, dict]:
    pr = ev.data["pull_request"]
    return pr["base"]["repo"]["full_name"], ev.installation_id or 0, pr, pr["head"]


def _is_fork(pr: dict) -> bool:
    head_repo = pr["head"].get("repo")
    return head_repo is None or head_repo["full_name"] != pr["base"]["repo"]["full_name"]


@router.register("pull_request", "labeled")
def labeled(ev: Event, ctx: Context) -> None:
    repo, inst, pr, head = _pr_fields(ev)
    name = (ev.data.get("label") or {}).get("name")
    if not name or name != trigger_label(ctx, repo, inst, pr["base"]["sha"]):
        return
    if pr.get("state") != "open":
        return
    if not client.can_write(ctx.gh(inst), repo, ev.sender or ""):
        log.warning("%s#%d: label %r by %s ignored: no write access", repo, pr["number"], name, ev.sender)
        return
    changed = client.pull_files(ctx.gh(inst), repo, pr["number"])
    start_job(
        ctx,
        delivery_id=ev.delivery_id,
        repo=repo,
        installation_id=inst,
        sha=head["sha"],  # pinned: what the labeller saw, not whatever the branch holds later
        ref=head["ref"],
        pr_number=pr["number"],
        trigger="label",
        changed_files=changed,
    )


@router.register("pull_request", "synchronize")
def synchronize(ev: Event, ctx: Context) -> None:
    repo, inst, pr, head = _pr_fields(ev)
    changed = client.pull_files(ctx.gh(inst), repo, pr["number"])
    if CONFIG_PATH in changed:
        validate_config(ctx, repo, inst, head["sha"])
    labels = {lb["name"] for lb in pr.get("labels", [])}
    label = trigger_label(ctx, repo, inst, pr["base"]["sha"])
    if label not in labels:
        return
    if _is_fork(pr):
        # New code from a fork was not seen by whoever labelled it: wait for a writer to label it again.
        log.warning("%s#%d: new commits on a labelled fork PR: not run until relabelled", repo, pr["number"])
        client.create_check_run(
            ctx.gh(inst),
            repo,
            name=ctx.settings.check_run_name,
            head_sha=head["sha"],
            status="completed",
            conclusion="neutral",
            title="Waiting for a maintainer",
            summary=f"New commits on a pull request from a fork are not run automatically. Someone with write "
            f"access can remove and re-add the `{label}` label to run fusebot on {head['sha'][:12]}.",
        )
        return
    start_job(
        ctx,
        delivery_id=ev.delivery_id,
        repo=repo,
        installation_id=inst,
        sha=head["sha"],
        ref=head["ref"],
        pr_number=pr["number"],
        trigger="label",
        changed_files=changed,
    )


@router.register("pull_request", "opened")
@router.register("pull_request", "reopened")
def opened(ev: Event, ctx: Context) -> None:
    """A PR that changes the config gets it validated on that PR."""
    repo, inst, pr, head = _pr_fields(ev)
    if CONFIG_PATH in client.pull_files(ctx.gh(inst), repo, pr["number"]):
        validate_config(ctx, repo, inst, head["sha"])


@router.register("pull_request", "closed")
def closed(ev: Event, ctx: Context) -> None:
    repo, _inst, pr, _head = _pr_fields(ev)
    cancelled = ctx.store.cancel(repo, pr_number=pr["number"])
    if cancelled:
        log.info("%s#%d closed: cancelled %d job(s)", repo, pr["number"], len(cancelled))
