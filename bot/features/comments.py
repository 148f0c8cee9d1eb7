"""`/fusebot ...` commands in pull request comments, from people with write access."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from bot.context import Context
from bot.features import bot_pr_commands
from bot.features.triggers import start_job
from bot.github import client
from bot.github.routing import Router
from bot.github.webhooks import Event

log = logging.getLogger(__name__)
router = Router()

PREFIX = "/fusebot"
HELP = """fusebot commands (from people with write access, in a comment on a pull request):

- `/fusebot run`: optimise the marked targets this pull request changes
- `/fusebot run all`: optimise every marked target at this pull request's head
- `/fusebot stop`: cancel this pull request's queued and running jobs
- `/fusebot status`: list this pull request's jobs
- `/fusebot help`: this message

On fusebot's own pull requests:

- `/fusebot explain`: post the whole search trace
- `/fusebot rerun`: search again from the base branch as it is now (this PR is updated)
- `/fusebot benchmark`: re-measure this PR's kernels as they are on its branch (your edits included); the numbers
  come as a comment
"""
STATUS_MARKER = "<!-- fusebot:status -->"


@dataclass(frozen=True)
class Command:
    name: str  # run, run-all, stop, status, help, unknown
    text: str


def parse_command(body: str) -> Command | None:
    """The command in the comment's first `/fusebot` line, or None when there is none."""
    for line in body.splitlines():
        words = line.strip().split()
        if not words or words[0].lower() != PREFIX:
            continue
        args = [w.lower() for w in words[1:]]
        text = " ".join(words)
        if args == ["run"]:
            return Command("run", text)
        if args == ["run", "all"]:
            return Command("run-all", text)
        if args in (["stop"], ["status"], ["help"], ["rerun"], ["benchmark"], ["explain"]):
            return Command(args[0], text)
        return Command("unknown", text)
    return None


def status_text(ctx: Context, repo: str, number: int) -> str:
    jobs = ctx.store.list_jobs(repo=repo, pr_number=number)
    if not jobs:
        return f"{STATUS_MARKER}\nNo fusebot jobs for this pull request yet."
    rows = ["| job | kind | commit | trigger | state | targets |", "| --- | --- | --- | --- | --- | --- |"]
    for j in jobs:
        n = len(j.spec.targets) if j.spec.kind == "search" else f"{len(j.spec.kernels)} kernel(s)"
        rows.append(f"| `{j.id[:12]}` | {j.spec.kind} | {j.sha[:12]} | {j.trigger} | {j.state} | {n} |")
    return STATUS_MARKER + "\n" + "\n".join(rows)


def changed_after(updated_at: datetime | None, comment_created_at: str | None) -> bool:
    """Whether the pull request was updated after the comment (unknown times count as changed)."""
    if updated_at is None or not comment_created_at:
        return True
    created = datetime.fromisoformat(comment_created_at.replace("Z", "+00:00"))
    return updated_at > created


@router.register("issue_comment", "created")
def comment_created(ev: Event, ctx: Context) -> None:
    issue = ev.data["issue"]
    if "pull_request" not in issue:
        return
    cmd = parse_command(ev.data["comment"].get("body") or "")
    if cmd is None or (ev.data.get("sender") or {}).get("type") == "Bot":
        return
    repo, inst, number = ev.repo or "", ev.installation_id or 0, issue["number"]
    gh = ctx.gh(inst)
    if not client.can_write(gh, repo, ev.sender or ""):
        log.warning("%s#%d: %r from %s ignored: no write access", repo, number, cmd.text, ev.sender)
        return
    comment_id = ev.data["comment"]["id"]
    if cmd.name == "unknown":
        client.react_to_comment(gh, repo, number, comment_id, "confused")
        client.post_comment(gh, repo, number, f"Unknown command `{cmd.text}`.\n\n{HELP}")
        return
    client.react_to_comment(gh, repo, number, comment_id, "+1")
    if cmd.name == "help":
        client.post_comment(gh, repo, number, HELP)
    elif cmd.name == "status":
        client.post_comment(gh, repo, number, status_text(ctx, repo, number))
    elif cmd.name in bot_pr_commands.COMMANDS:  # on fusebot's own PRs (issue 6)
        bot_pr_commands.handle(ctx, ev, gh, repo, inst, number, cmd.name)
    elif cmd.name == "stop":
        n = len(ctx.store.cancel(repo, pr_number=number))
        client.post_comment(gh, repo, number, f"Cancelled {n} fusebot job(s) on this pull request.")
    else:
        pr = client.pull(gh, repo, number)
        if pr.state != "open":
            client.post_comment(gh, repo, number, "This pull request is closed: nothing to run.")
            return
        if pr.is_fork and changed_after(pr.updated_at, ev.data["comment"].get("created_at")):
            # Code from a fork runs only as the commenter saw it: a push after the command needs a new command.
            log.warning("%s#%d: fork PR changed after %r: not run", repo, number, cmd.text)
            client.post_comment(gh, repo, number, f"This pull request changed after `{cmd.text}` was posted. "
                                f"Comment again to run fusebot on its current head ({pr.head_sha[:12]}).")
            return
        changed = None if cmd.name == "run-all" else client.pull_files(gh, repo, number)
        start_job(
            ctx,
            delivery_id=ev.delivery_id,
            repo=repo,
            installation_id=inst,
            sha=pr.head_sha,
            ref=pr.head_ref,
            pr_number=number,
            trigger="comment",
            changed_files=changed,
        )
