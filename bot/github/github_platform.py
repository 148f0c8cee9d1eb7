"""The GitHub platform: the `Platform` interface on GitHub's REST API, every request through bot/github/client.py.

Files are committed with the git data API (one tree on the base commit's tree, one commit, the branch ref moved with
force), so nothing is cloned or pushed and the runner never holds credentials. A PR is found again by its head branch
and the hidden marker in its body; comments by their marker. The App builds one per installation and repository
(`Context.platform`), the Action one on the workflow's token (`client.token_client`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import UTC
from typing import Any, TypeVar

from github import Github, InputGitTreeElement, UnknownObjectException

from bot.github.client import call_renewing
from bot.github.platform import (
    BranchUpdate,
    CheckOutput,
    CommentRef,
    PullInfo,
    PullRequestRef,
    find_marker,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

_SHA = re.compile(r"^[0-9a-f]{40}$")
TITLE_LIMIT = 255
TEXT_LIMIT = 65_535
ANNOTATIONS_PER_REQUEST = 50  # GitHub takes 50 per request


class GitHubPlatform:
    def __init__(self, gh: Github, repo: str):
        self.gh, self.full_name = gh, repo
        self.owner = repo.split("/", 1)[0]
        self._repo = gh.get_repo(repo)  # (the client is built lazy: no request here)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """One operation; GitHub's refusal as PlatformError, a stale installation token renewed once."""
        return call_renewing(self.gh, what, fn)

    # ---- git ----
    def default_branch(self) -> str:
        return self._call("repository", lambda: self.gh.get_repo(self.full_name).default_branch)

    def head_sha(self, ref: str) -> str:
        if _SHA.match(ref):
            return ref
        return self._call(f"ref {ref}", lambda: self._repo.get_git_ref(f"heads/{ref}").object.sha)

    def read_file(self, ref: str, path: str) -> str | None:
        def read() -> str | None:
            try:
                content = self._repo.get_contents(path, ref=ref)
            except UnknownObjectException:
                return None
            if isinstance(content, list):
                return None  # a directory
            return content.decoded_content.decode("utf-8", errors="replace")

        return self._call(f"contents of {path}", read)

    def commit_files(self, branch: str, base_sha: str, files: dict[str, str | None], message: str) -> BranchUpdate:
        def run() -> BranchUpdate:
            base = self._repo.get_git_commit(base_sha)
            elements = [InputGitTreeElement(path, "100644", "blob", content=text) if text is not None
                        else InputGitTreeElement(path, "100644", "blob", sha=None)
                        for path, text in sorted(files.items())]
            tree = self._repo.create_git_tree(elements, base.tree)
            try:
                ref = self._repo.get_git_ref(f"heads/{branch}")
                tip = ref.object.sha  # (a lazy client fetches here)
            except UnknownObjectException:
                ref = None
            if ref is not None:
                current = self._repo.get_git_commit(tip)
                if current.tree.sha == tree.sha and [p.sha for p in current.parents] == [base_sha]:
                    return BranchUpdate(branch, current.sha, changed=False)
            commit = self._repo.create_git_commit(message, tree, [base])
            if ref is None:
                self._repo.create_git_ref(f"refs/heads/{branch}", commit.sha)
            else:
                ref.edit(commit.sha, force=True)
            log.info("%s: branch %s -> %s", self.full_name, branch, commit.sha[:12])
            return BranchUpdate(branch, commit.sha, changed=True)

        return self._call(f"commit to {branch}", run)

    # ---- pull requests, comments, check runs ----
    def upsert_pull_request(self, *, branch: str, base: str, title: str, body: str, key: str) -> PullRequestRef:
        def run() -> PullRequestRef:
            for pull in self._repo.get_pulls(state="open", head=f"{self.owner}:{branch}", base=base):
                if pull.head.ref == branch and find_marker(pull.body, "pr") == key:
                    pull.edit(title=title, body=body)
                    return PullRequestRef(pull.number, pull.html_url, created=False)
            pull = self._repo.create_pull(base=base, head=branch, title=title, body=body, maintainer_can_modify=True)
            return PullRequestRef(pull.number, pull.html_url, created=True)

        return self._call(f"pull request for {branch}", run)

    def upsert_comment(self, issue_number: int, kind: str, key: str, body: str) -> CommentRef:
        def run() -> CommentRef:
            issue = self._repo.get_issue(issue_number)
            for comment in issue.get_comments():
                if find_marker(comment.body, kind) == key:
                    if comment.body != body:
                        comment.edit(body)
                    return CommentRef(comment.id, created=False)
            return CommentRef(issue.create_comment(body).id, created=True)

        return self._call(f"comment on #{issue_number}", run)

    def post_comment(self, issue_number: int, body: str) -> int:
        return int(self._call(f"comment on #{issue_number}",
                        lambda: self._repo.get_issue(issue_number).create_comment(body)).id)

    def react_to_comment(self, issue_number: int, comment_id: int, content: str) -> None:
        self._call("reaction", lambda: self._repo.get_issue(issue_number).get_comment(comment_id).create_reaction(content))

    def create_check_run(self, head_sha: str, name: str, output: CheckOutput, external_id: str | None = None) -> int:
        kwargs = check_run_fields(output)
        if external_id is not None:
            kwargs["external_id"] = external_id
        run = self._call("create check run", lambda: self._repo.create_check_run(name=name, head_sha=head_sha, **kwargs))
        return int(run.id)

    def update_check_run(self, check_run_id: int, output: CheckOutput) -> None:
        self._call("update check run", lambda: self._repo.get_check_run(check_run_id).edit(**check_run_fields(output)))

    def find_check_run(self, head_sha: str, name: str) -> int | None:
        """The id of a check run called `name` on the commit (the newest), or None."""
        def run() -> int | None:
            found = [r.id for r in self._repo.get_commit(head_sha).get_check_runs(check_name=name) if r.name == name]
            return max(found) if found else None

        return self._call(f"check runs of {head_sha[:12]}", run)

    # ---- what the App's features read ----
    def pull(self, number: int) -> PullInfo:
        def read() -> PullInfo:
            pr = self._repo.get_pull(number)  # lazy: the first attribute read fetches it
            head_repo = pr.head.repo.full_name if pr.head.repo is not None else None
            return PullInfo(
                number=number,
                head_sha=pr.head.sha,
                head_ref=pr.head.ref,
                head_repo=head_repo,
                base_repo=pr.base.repo.full_name,
                base_ref=pr.base.ref,
                state=pr.state,
                labels=tuple(label.name for label in pr.labels),
                updated_at=pr.updated_at.replace(tzinfo=pr.updated_at.tzinfo or UTC) if pr.updated_at else None,
            )

        return self._call(f"pull request {number}", read)

    def pull_files(self, number: int) -> list[str]:
        """Paths the PR changes (renamed files under both names)."""
        files = self._call("pull files", lambda: list(self._repo.get_pull(number).get_files()))
        out: list[str] = []
        for f in files:
            out.append(f.filename)
            if f.previous_filename:
                out.append(f.previous_filename)
        return out

    def pull_body(self, number: int) -> str:
        return self._call(f"pull request {number}", lambda: self._repo.get_pull(number).body or "")

    def permission(self, user: str) -> str:
        """The user's permission on the repository: admin, write, read or none (the collaborator permission API)."""
        def read() -> str:
            try:
                return self._repo.get_collaborator_permission(user)
            except UnknownObjectException:
                return "none"  # not a user GitHub knows as a collaborator

        return self._call(f"permission of {user} on {self.full_name}", read)


def check_run_fields(o: CheckOutput) -> dict[str, Any]:
    """A check run's status, conclusion, output and buttons as GitHub's API takes them, cut to its limits."""
    out: dict[str, Any] = {"title": o.title[:TITLE_LIMIT], "summary": o.summary[:TEXT_LIMIT]}
    if o.text:
        out["text"] = o.text[:TEXT_LIMIT]
    if o.annotations:
        out["annotations"] = [a.as_api() for a in o.annotations[:ANNOTATIONS_PER_REQUEST]]
    kwargs: dict[str, Any] = {"status": o.status, "output": out}
    if o.conclusion is not None:
        kwargs["conclusion"] = o.conclusion
    if o.actions is not None:
        kwargs["actions"] = list(o.actions)
    return kwargs

