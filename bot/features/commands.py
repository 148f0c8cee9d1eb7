"""`/fusebot ...` commands in pull request comments, from people with write access (every command once, in COMMANDS).

On any PR: `run`, `run all`, `stop`, `status`, `help`. On fusebot's own PRs, whose body carries the job they came
from (`<!-- fusebot:job key=<id> -->`): `explain` posts that job's whole search trace; `rerun` starts a new job on
the PR's base branch as it is now, delivered like the first one (to the same labelled PR, the same branch and PR; on
the hygiene PR, hygiene again); `benchmark` starts a benchmark job: the kernel folders this PR touches, re-verified
and re-timed as they are on its branch (a maintainer's edits included), the numbers posted here as a comment
(bot/publish/benchmark.py). On the hygiene PR, whose branch removes the kernels, they are measured as they are on the
base branch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from bot.context import Context
from bot.features.status import status_text
from bot.features.triggers import start_job, start_kernel_job
from bot.github.platform import Platform, PlatformError, PullInfo, can_write, find_marker
from bot.github.routing import Router
from bot.github.webhooks import Event
from bot.publish.comments import explain_comments
from bot.repo.config import CONFIG_PATH
from bot.store.jobs import JobInfo

log = logging.getLogger(__name__)
router = Router()

PREFIX = "/fusebot"


@dataclass(frozen=True)
class CommandSpec:
    """One `/fusebot` command: its words after the prefix, its line in the help, and whether it works only on
    fusebot's own pull requests (it needs the job they came from)."""

    words: tuple[str, ...]
    summary: str
    bot_pr: bool = False


# Every command, once: the parser, the help text and the dispatch (`comment_created`) are all read from here, and
# tests/bot/features/test_handlers.py holds docs/bot.md's commands to it.
COMMANDS: dict[str, CommandSpec] = {
    "run": CommandSpec(("run",), "optimise the marked targets this pull request changes"),
    "run-all": CommandSpec(("run", "all"), "optimise every marked target at this pull request's head"),
    "stop": CommandSpec(("stop",), "cancel this pull request's queued and running jobs"),
    "status": CommandSpec(("status",), "this pull request's jobs: state, attempts, when queued, started and finished"),
    "help": CommandSpec(("help",), "this message"),
    "explain": CommandSpec(("explain",), "post the whole search trace", bot_pr=True),
    "rerun": CommandSpec(("rerun",), "search again from the base branch as it is now (this PR is updated)",
                         bot_pr=True),
    "benchmark": CommandSpec(("benchmark",), "re-measure this PR's kernels as they are on its branch (your edits "
                             "included); the numbers come as a comment", bot_pr=True),
}
BOT_PR_COMMANDS = tuple(name for name, c in COMMANDS.items() if c.bot_pr)


def _help_line(name: str) -> str:
    c = COMMANDS[name]
    alone = f" (or `{PREFIX}` alone)" if name == "help" else ""
    return f"- `{PREFIX} {' '.join(c.words)}`{alone}: {c.summary}"


HELP = "\n".join([
    "fusebot commands (from people with write access, in a comment on a pull request):", "",
    *(_help_line(n) for n, c in COMMANDS.items() if not c.bot_pr), "",
    "On fusebot's own pull requests:", "",
    *(_help_line(n) for n in BOT_PR_COMMANDS), ""])


@dataclass(frozen=True)
class Command:
    name: str  # a key of COMMANDS, or unknown
    text: str


def parse_command(body: str) -> Command | None:
    """The command in the comment's first `/fusebot` line, or None when there is none (`/fusebot` alone: help)."""
    for line in body.splitlines():
        words = line.strip().split()
        if not words or words[0].lower() != PREFIX:
            continue
        args = tuple(w.lower() for w in words[1:]) or ("help",)
        name = next((n for n, c in COMMANDS.items() if c.words == args), "unknown")
        return Command(name, " ".join(words))
    return None


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
    host = ctx.platform(inst, repo)
    if not can_write(host, ev.sender or ""):
        log.warning("%s#%d: %r from %s ignored: no write access", repo, number, cmd.text, ev.sender)
        return
    comment_id = ev.data["comment"]["id"]
    if cmd.name == "unknown":
        acknowledge(host, number, comment_id, "confused")
        host.post_comment(number, f"Unknown command `{cmd.text}`.\n\n{HELP}")
        return
    acknowledge(host, number, comment_id, "+1")
    if cmd.name in BOT_PR_COMMANDS:
        on_bot_pr(ctx, ev, host, inst, number, cmd.name)
    else:
        HANDLERS[cmd.name](ctx, ev, host, inst, number, cmd)


def stop(ctx: Context, ev: Event, host: Platform, inst: int, number: int, cmd: Command) -> None:
    n = len(ctx.store.cancel(ev.repo or "", pr_number=number))
    host.post_comment(number, f"Cancelled {n} fusebot job(s) on this pull request.")


def acknowledge(host: Platform, number: int, comment_id: int, content: str) -> None:
    """React to the command's comment. Best-effort: a refused reaction is logged and the command still answered."""
    try:
        host.react_to_comment(number, comment_id, content)
    except PlatformError as e:
        log.warning("#%d: reaction %r to comment %s not added (the command is answered anyway): %s", number,
                    content, comment_id, e)


def run(ctx: Context, ev: Event, host: Platform, inst: int, number: int, cmd: Command) -> None:
    """`run` and `run all`: a search at the PR's head, of the targets it changes or of all of them."""
    repo = ev.repo or ""
    pull = host.pull(number)
    if pull.state != "open":
        host.post_comment(number, "This pull request is closed: nothing to run.")
        return
    if pull.is_fork and changed_after(pull.updated_at, ev.data["comment"].get("created_at")):
        # Code from a fork runs only as the commenter saw it: a push after the command needs a new command.
        log.warning("%s#%d: fork PR changed after %r: not run", repo, number, cmd.text)
        host.post_comment(number, f"This pull request changed after `{cmd.text}` was posted. Comment again to run "
                                  f"fusebot on its current head ({pull.head_sha[:12]}).")
        return
    changed = None if cmd.name == "run-all" else host.pull_files(number)
    start_job(ctx, delivery_id=ev.delivery_id, repo=repo, installation_id=inst, sha=pull.head_sha, ref=pull.head_ref,
              pr_number=number, trigger="comment", changed_files=changed)


HANDLERS = {  # the commands that work on any PR (BOT_PR_COMMANDS go through on_bot_pr)
    "run": run,
    "run-all": run,
    "stop": stop,
    "status": lambda ctx, ev, host, inst, number, cmd: host.post_comment(
        number, status_text(ctx.store, ev.repo or "", number)),
    "help": lambda ctx, ev, host, inst, number, cmd: host.post_comment(number, HELP),
}


# ---- on fusebot's own pull requests ----------------------------------------------------------------------------

def on_bot_pr(ctx: Context, ev: Event, host: Platform, inst: int, number: int, name: str) -> None:
    pull = host.pull(number)
    ours = pull.head_ref.startswith("fusebot/") and not pull.is_fork  # fusebot never opens a PR from a fork
    job_id = find_marker(host.pull_body(number), "job") if ours else None
    job = ctx.store.get(job_id) if job_id else None
    if job is None:
        host.post_comment(number, f"`/fusebot {name}` works on fusebot's own pull requests (it needs the job they "
                                  "came from); on other PRs use `/fusebot run`.")
        return
    if name == "explain":
        for text in explain_comments(job.id, job.result.targets if job.result else []):
            host.post_comment(number, text)
    elif name == "rerun":
        rerun(ctx, ev, host, inst, number, pull.base_ref, job)
    else:
        benchmark(ctx, ev, host, inst, pull, job)


def rerun(ctx: Context, ev: Event, host: Platform, inst: int, number: int, ref: str, job: JobInfo) -> None:
    repo = ev.repo or ""
    sha = host.head_sha(ref)
    if job.spec.kind == "hygiene":
        started = start_kernel_job(ctx, kind="hygiene", delivery_id=ev.delivery_id, repo=repo, installation_id=inst,
                                   sha=sha, ref=ref, trigger="comment")
        host.post_comment(number, f"Re-verifying the merged fusebot kernels on `{ref}` at `{sha[:12]}`; this PR is "
                                  "updated when it finishes." if started.job else
                                  f"No fusebot kernels are left on `{ref}` at `{sha[:12]}`: nothing to re-verify.")
        return
    start_job(ctx, delivery_id=ev.delivery_id, repo=repo, installation_id=inst, sha=sha, ref=ref,
              pr_number=job.pr_number, trigger="comment", changed_files=None)
    host.post_comment(number, f"Searching again on `{ref}` at `{sha[:12]}`; this PR is updated when it finishes.")


def benchmark(ctx: Context, ev: Event, host: Platform, inst: int, pull: PullInfo, job: JobInfo) -> None:
    """The kernels this PR touches, at its head (the base branch's head for the hygiene PR, which removes them)."""
    repo, number = ev.repo or "", pull.number
    if job.spec.kind == "hygiene":
        ref, sha = pull.base_ref, host.head_sha(pull.base_ref)
    else:
        ref, sha = pull.head_ref, pull.head_sha
    started = start_kernel_job(ctx, kind="benchmark", delivery_id=ev.delivery_id, repo=repo, installation_id=inst,
                               sha=sha, ref=ref, pr_number=number, trigger="comment",
                               changed_files=host.pull_files(number))
    if started.config is None:  # reported with annotations on the `fusebot config` check run
        host.post_comment(number, f"`{CONFIG_PATH}` at `{sha[:12]}` is invalid (see the config check run): nothing "
                                  "was measured.")
        return
    if started.job is None:
        host.post_comment(number, f"No fusebot kernel of this pull request is on `{ref}` at `{sha[:12]}` under "
                                  f"`{started.config.kernels_dir}/`: nothing to measure.")
        return
    kernels = ", ".join(f"`{k}`" for k in started.job.spec.kernels)
    host.post_comment(number, f"Re-measuring {kernels} as they are on `{ref}` at `{sha[:12]}` (every trial, eager "
                              "and torch.compile, the drop-in's test); the numbers come here as a comment.")
