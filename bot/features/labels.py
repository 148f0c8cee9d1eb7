"""pull_request events: the trigger label, new commits on a labelled PR, config changes, closed PRs."""

from __future__ import annotations

import logging

from bot.context import Context
from bot.features.triggers import start_job, validate_config
from bot.github.platform import CheckOutput, can_write
from bot.github.routing import Router
from bot.github.webhooks import Event
from bot.repo.config import CONFIG_PATH, ConfigError, load_config

log = logging.getLogger(__name__)
router = Router()


def trigger_label(ctx: Context, repo: str, installation_id: int, ref: str) -> str:
    """The repository's trigger label, from its config at `ref` (the PR's base), else the bot's default."""
    text = ctx.platform(installation_id, repo).read_file(ref, CONFIG_PATH)
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
    host = ctx.platform(inst, repo)
    if not can_write(host, ev.sender or ""):
        log.warning("%s#%d: label %r by %s ignored: no write access", repo, pr["number"], name, ev.sender)
        return
    changed = host.pull_files(pr["number"])
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
    host = ctx.platform(inst, repo)
    changed = host.pull_files(pr["number"])
    if CONFIG_PATH in changed:
        validate_config(ctx, repo, inst, head["sha"])
    labels = {lb["name"] for lb in pr.get("labels", [])}
    label = trigger_label(ctx, repo, inst, pr["base"]["sha"])
    if label not in labels:
        return
    if _is_fork(pr):
        # New code from a fork was not seen by whoever labelled it: wait for a writer to label it again.
        log.warning("%s#%d: new commits on a labelled fork PR: not run until relabelled", repo, pr["number"])
        host.create_check_run(head["sha"], ctx.settings.check_run_name, CheckOutput(
            "completed", "Waiting for a maintainer",
            f"New commits on a pull request from a fork are not run automatically. Someone with write access can "
            f"remove and re-add the `{label}` label to run fusebot on {head['sha'][:12]}.", "neutral"))
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
    if CONFIG_PATH in ctx.platform(inst, repo).pull_files(pr["number"]):
        validate_config(ctx, repo, inst, head["sha"])


@router.register("pull_request", "closed")
def closed(ev: Event, ctx: Context) -> None:
    repo, _inst, pr, _head = _pr_fields(ev)
    cancelled = ctx.store.cancel(repo, pr_number=pr["number"])
    if cancelled:
        log.info("%s#%d closed: cancelled %d job(s)", repo, pr["number"], len(cancelled))
