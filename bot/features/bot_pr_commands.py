"""`/fusebot rerun`, `/fusebot benchmark`, `/fusebot explain` on fusebot's own pull requests.

A fusebot PR's body carries the job it came from (`<!-- fusebot:job key=<id> -->`): `explain` posts that job's whole
search trace; `rerun` starts a new job on the PR's base branch as it is now, delivered like the first one (to the
same labelled PR, the same branch and PR; on the hygiene PR, hygiene again). `benchmark` starts a benchmark job: the
kernel folders this PR touches, re-verified and re-timed as they are on its branch (a maintainer's edits included),
the numbers posted here as a comment (bot/publish/benchmark.py). On the hygiene PR, whose branch removes the kernels, they are
measured as they are on the base branch.
"""

from __future__ import annotations

import logging

from github import Github

from bot.context import Context
from bot.features.triggers import start_job, start_kernel_job
from bot.github import client
from bot.github.webhooks import Event
from bot.publish import pr
from bot.repo.config import CONFIG_PATH
from bot.store.jobs import JobInfo

log = logging.getLogger(__name__)

COMMANDS = ("rerun", "benchmark", "explain")


def _body(gh: Github, repo: str, number: int) -> str:
    try:
        return gh.get_repo(repo).get_pull(number).body or ""
    except Exception as e:  # noqa: BLE001 - any GitHub failure is reported the same way
        raise client.GitHubError(f"pull request {number}: {e}") from None


def _branch_head(gh: Github, repo: str, ref: str) -> str:
    try:
        return gh.get_repo(repo).get_branch(ref).commit.sha
    except Exception as e:  # noqa: BLE001 - any GitHub failure is reported the same way
        raise client.GitHubError(f"branch {ref}: {e}") from None


def handle(ctx: Context, ev: Event, gh: Github, repo: str, installation_id: int, number: int, name: str) -> None:
    pull = client.pull(gh, repo, number)
    ours = pull.head_ref.startswith("fusebot/") and not pull.is_fork  # fusebot never opens a PR from a fork
    job_id = pr.find_marker(_body(gh, repo, number), "job") if ours else None
    job = ctx.store.get(job_id) if job_id else None
    if job is None:
        client.post_comment(gh, repo, number, f"`/fusebot {name}` works on fusebot's own pull requests (it needs the "
                                              "job they came from); on other PRs use `/fusebot run`.")
        return
    if name == "explain":
        results = job.result.targets if job.result else []
        for text in pr.explain_comments(job.id, results):
            client.post_comment(gh, repo, number, text)
    elif name == "rerun":
        rerun(ctx, ev, gh, repo, installation_id, number, pull.base_ref, job)
    else:
        benchmark(ctx, ev, gh, repo, installation_id, pull, job)


def rerun(ctx: Context, ev: Event, gh: Github, repo: str, installation_id: int, number: int, ref: str,
          job: JobInfo) -> None:
    sha = _branch_head(gh, repo, ref)
    if job.spec.kind == "hygiene":
        started = start_kernel_job(ctx, kind="hygiene", delivery_id=ev.delivery_id, repo=repo,
                                   installation_id=installation_id, sha=sha, ref=ref, trigger="comment")
        client.post_comment(gh, repo, number, f"Re-verifying the merged fusebot kernels on `{ref}` at `{sha[:12]}`; "
                                              "this PR is updated when it finishes." if started.job else
                                              f"No fusebot kernels are left on `{ref}` at `{sha[:12]}`: nothing to "
                                              "re-verify.")
        return
    start_job(ctx, delivery_id=ev.delivery_id, repo=repo, installation_id=installation_id, sha=sha, ref=ref,
              pr_number=job.pr_number, trigger="comment", changed_files=None)
    client.post_comment(gh, repo, number, f"Searching again on `{ref}` at `{sha[:12]}`; this PR is updated when "
                                          "it finishes.")


def benchmark(ctx: Context, ev: Event, gh: Github, repo: str, installation_id: int, pull: client.PullInfo,
              job: JobInfo) -> None:
    """The kernels this PR touches, at its head (the base branch's head for the hygiene PR, which removes them)."""
    number = pull.number
    if job.spec.kind == "hygiene":
        ref, sha = pull.base_ref, _branch_head(gh, repo, pull.base_ref)
    else:
        ref, sha = pull.head_ref, pull.head_sha
    started = start_kernel_job(ctx, kind="benchmark", delivery_id=ev.delivery_id, repo=repo,
                               installation_id=installation_id, sha=sha, ref=ref, pr_number=number,
                               trigger="comment", changed_files=client.pull_files(gh, repo, number))
    if started.config is None:  # reported with annotations on the `fusebot config` check run
        client.post_comment(gh, repo, number, f"`{CONFIG_PATH}` at `{sha[:12]}` is invalid (see the config check "
                                              "run): nothing was measured.")
        return
    if started.job is None:
        client.post_comment(gh, repo, number, f"No fusebot kernel of this pull request is on `{ref}` at `{sha[:12]}` "
                                              f"under `{started.config.kernels_dir}/`: nothing to measure.")
        return
    kernels = ", ".join(f"`{k}`" for k in started.job.spec.kernels)
    client.post_comment(gh, repo, number, f"Re-measuring {kernels} as they are on `{ref}` at `{sha[:12]}` (every "
                                          "trial, eager and torch.compile, the drop-in's test); the numbers come "
                                          "here as a comment.")
