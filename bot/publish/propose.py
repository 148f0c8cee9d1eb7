"""From a search's results to what users see, on any Platform: the branch, the PR, the check run, the comments.

    propose(platform, plan, base_sha=..., check_run_id=..., label_pr=..., fork=...)

- nothing improved: the check run completes `neutral` with the reasons; no branch, no PR; the status comment says so;
- a fork's PR: no push; the results and a `git apply`-able patch go into comments (whole files in each, as many as
  it takes), the check run completes;
- otherwise: the branch `fusebot/<base>/<group>` is (re)built as one commit on the base with the kernels directory's
  files, the PR is found by branch and marker and updated (or opened), the check run links it, and the labelled PR's
  status comment links it too.

A re-run that produced the same files as the branch holds commits nothing: a file whose text differs from the
branch's only in its timestamps (the provenance date in the kernel's header and in BENCHMARK.md, written anew by every
run) keeps the branch's text, so the tree is unchanged and the platform makes no commit. The PR is still updated.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from bot.github.patch import unified_patch
from bot.github.platform import BranchUpdate, CheckOutput, Platform, PlatformError, PullRequestRef, find_marker
from bot.publish.body import pr_body, pr_title
from bot.publish.checks import check_completed
from bot.publish.comments import fork_comments, status_comment
from bot.publish.plan import PullRequestPlan
from bot.publish.text import BODY_LIMIT, clip
from bot.publish.verdicts import speedup

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Published:
    pull_request: PullRequestRef | None
    branch: BranchUpdate | None
    body: str  # the PR body, or the comment that stands for it (fork), or the check summary (nothing improved)
    conclusion: str


def branch_files(plan: PullRequestPlan, base: Callable[[str], str | None] | None = None) -> dict[str, str | None]:
    """Repository path -> text of every improved target's files: under the kernels directory, except a key starting
    with "/" (a PyTorch rewrite's module, or the module a kernel's drop-in is adopted by: its repository path,
    runner/results/proposal.py). Where several targets change one such file (two classes of one module), the file
    holds every target's change: each made against `base(path)`, its text on the base branch, and put together
    (`merged`); where they cannot be (two change the same lines), the first target's change stands alone (logged)."""
    files: dict[str, str | None] = {}
    changes: dict[str, list[str]] = {}
    for r in plan.improved:
        for path, text in sorted(r.files.items()):
            key = path[1:] if path.startswith("/") else f"{plan.kernels_dir}/{path}"
            if path.startswith("/"):
                changes.setdefault(key, [])
                if text not in changes[key]:
                    changes[key].append(text)
            files[key] = text
    for key, texts in changes.items():
        if len(texts) < 2:
            continue
        original = base(key) if base is not None else None
        together = merged(original, texts) if original is not None else None
        if together is None:
            log.error("%s: %d targets change %s and their changes cannot be put together; the first one's stands",
                      plan.repo, len(texts), key)
        files[key] = together if together is not None else texts[0]
    return files


def merged(original: str, texts: list[str]) -> str | None:
    """`original` with the changes of every text in `texts` (each `original` changed), lines inserted at one place
    kept in the texts' order (two targets' adoption lines at a module's end); None where two change the same lines
    differently. Pure."""
    old = original.splitlines(keepends=True)
    edits = []  # (first line replaced, line after the last, the new lines, which text)
    for n, text in enumerate(texts):
        new = text.splitlines(keepends=True)
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
            if tag != "equal":
                edits.append((i1, i2, new[j1:j2], n))
    out, at, taken = [], 0, set()
    for i1, i2, lines, _ in sorted(edits, key=lambda e: (e[0], e[1], e[3])):
        if (i1, i2, tuple(lines)) in taken:
            continue  # the same change in two texts
        if i1 < at:
            return None
        out += old[at:i1] + lines
        at = i2
        taken.add((i1, i2, tuple(lines)))
    return "".join(out + old[at:])


_TIMESTAMP = re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?\b")


def same_but_timestamps(a: str, b: str) -> bool:
    """True when the texts are equal once every ISO 8601 date-time in them is blanked out. Pure."""
    return a == b or _TIMESTAMP.sub("<time>", a) == _TIMESTAMP.sub("<time>", b)


def keep_unchanged(platform: Platform, branch: str, files: dict[str, str | None]) -> dict[str, str | None]:
    """`files`, with the branch's own text for each file that differs from it only in timestamps."""
    if not any(text is not None and _TIMESTAMP.search(text) for text in files.values()):
        return files
    try:
        tip = platform.head_sha(branch)
    except PlatformError:  # no such branch yet: everything is new
        return files
    out = dict(files)
    for path, text in files.items():
        if text is None or not _TIMESTAMP.search(text):
            continue
        old = platform.read_file(tip, path)
        if old is not None and old != text and same_but_timestamps(old, text):
            out[path] = old
            log.debug("%s: %s differs from the branch only in timestamps; kept as it is", branch, path)
    return out


def commit_message(plan: PullRequestPlan) -> str:
    lines = [pr_title(plan), ""]
    for r in plan.improved:
        s = speedup(r.verdict)
        lines.append(f"- {r.class_name or r.target}: {s:.2f}x over the faster baseline" if s is not None
                     else f"- {r.class_name or r.target}")
    return "\n".join(lines) + f"\n\nSearched at {plan.commit}.\n"


def propose(platform: Platform, plan: PullRequestPlan, *, base_sha: str, check_run_id: int | None = None,
            label_pr: int | None = None, fork: bool = False) -> Published:
    if not plan.improved:
        out = check_completed(plan)
        _finish_check(platform, check_run_id, out)
        if label_pr is not None:
            platform.upsert_comment(label_pr, "status", f"pr-{label_pr}",
                                    status_comment(label_pr, "no faster kernel found", plan))
        log.info("%s: nothing improved; no pull request", plan.repo)
        return Published(None, None, out.summary, "neutral")
    files = branch_files(plan, lambda path: platform.read_file(base_sha, path))
    if fork:
        if label_pr is None:
            raise ValueError("a fork's results go to its PR: label_pr is required")
        patch = unified_patch({p: platform.read_file(base_sha, p) for p in files}, files)
        comments = fork_comments(plan, patch)
        for text in comments:
            platform.upsert_comment(label_pr, "fork", find_marker(text, "fork") or f"pr-{label_pr}", text)
        body = comments[0]
        out = check_completed(plan)
        _finish_check(platform, check_run_id, CheckOutput(out.status, out.title, out.summary, out.conclusion,
                                                             _patch_text(patch)))
        return Published(None, None, body, out.conclusion or "success")
    update = platform.commit_files(plan.branch, base_sha, keep_unchanged(platform, plan.branch, files),
                                   commit_message(plan))
    body = pr_body(plan)
    ref = platform.upsert_pull_request(branch=plan.branch, base=plan.base, title=pr_title(plan), body=body,
                                       key=plan.key)
    out = check_completed(plan, pr_url=ref.url)
    _finish_check(platform, check_run_id, out)
    if label_pr is not None:
        platform.upsert_comment(label_pr, "status", f"pr-{label_pr}",
                                status_comment(label_pr, "done", plan, pr_url=ref.url))
    log.info("%s: %s pull request %s on %s", plan.repo, "opened" if ref.created else "updated", ref.number,
             plan.branch)
    return Published(ref, update, body, out.conclusion or "success")


def _patch_text(patch: str) -> str:
    text = f"Apply with `git apply`:\n\n```diff\n{patch}\n```"
    if len(text) > BODY_LIMIT:  # a cut patch does not apply: point to the comments that hold it whole
        return f"The patch ({len(patch)} characters) is more than a check run holds: it is in fusebot's comments on " \
               "the pull request, whole files in each."
    return clip(text, keep_paths=True)


def _finish_check(platform: Platform, check_run_id: int | None, out: CheckOutput) -> None:
    if check_run_id is not None:
        platform.update_check_run(check_run_id, out)
