"""`/fusebot rerun`, `/fusebot benchmark`, `/fusebot explain` on fusebot's own pull requests.

A fusebot PR's body carries the job it came from (`<!-- fusebot:job key=<id> -->`): `explain` posts that job's whole
search trace; `rerun` starts a new job on the PR's base branch as it is now, delivered like the first one (to the
same labelled PR, the same branch and PR). `benchmark` (re-measure the kernels as they are on the branch) is answered
with what to do instead until the runner can time a branch's kernels as they stand.
"""

from __future__ import annotations

import logging

from github import Github

from bot import github, pr
from bot.context import Context
from bot.triggers import start_job
from bot.webhooks import Event

log = logging.getLogger(__name__)

COMMANDS = ("rerun", "benchmark", "explain")


def _body(gh: Github, repo: str, number: int) -> str:
    try:
        return gh.get_repo(repo).get_pull(number).body or ""
    except Exception as e:  # noqa: BLE001 - any GitHub failure is reported the same way
        raise github.GitHubError(f"pull request {number}: {e}") from None


def handle(ctx: Context, ev: Event, gh: Github, repo: str, installation_id: int, number: int, name: str) -> None:
    pull = github.pull(gh, repo, number)
    job_id = pr.find_marker(_body(gh, repo, number), "job") if pull.head_ref.startswith("fusebot/") else None
    job = ctx.store.get(job_id) if job_id else None
    if job is None:
        github.post_comment(gh, repo, number, f"`/fusebot {name}` works on fusebot's own pull requests (it needs the "
                                              "job they came from); on other PRs use `/fusebot run`.")
        return
    if name == "explain":
        results = job.result.targets if job.result else []
        for text in pr.explain_comments(job.id, results):
            github.post_comment(gh, repo, number, text)
    elif name == "rerun":
        ref = pull.base_ref
        sha = gh.get_repo(repo).get_branch(ref).commit.sha
        start_job(ctx, delivery_id=ev.delivery_id, repo=repo, installation_id=installation_id, sha=sha, ref=ref,
                  pr_number=job.pr_number, trigger="comment", changed_files=None)
        github.post_comment(gh, repo, number, f"Searching again on `{ref}` at `{sha[:12]}`; this PR is updated when "
                                              "it finishes.")
    else:
        github.post_comment(gh, repo, number, "`/fusebot benchmark` (re-measuring the kernels as they are on this "
                                              "branch) is not available yet; `/fusebot rerun` searches and measures "
                                              "again from the base branch.")
