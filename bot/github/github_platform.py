"""The GitHub platform: the `Platform` interface on GitHub's REST API through PyGithub (base_url configurable).

Files are committed with the git data API (one tree on the base commit's tree, one commit, the branch ref moved with
force), so nothing is cloned or pushed and the runner never holds credentials. A PR is found again by its head branch
and the hidden marker in its body; comments by their marker. Until bot/github/client.py (the App's client factory) lands,
construct it from any authenticated `github.Github` client: `GitHubPlatform(Github(auth=..., base_url=...), repo)`.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from github import Github, GithubException, InputGitTreeElement, UnknownObjectException

from bot.github.platform import BranchUpdate, CommentRef, PlatformError, PullRequestRef
from bot.publish.pr import CheckOutput, find_marker

log = logging.getLogger(__name__)

_SHA = re.compile(r"^[0-9a-f]{40}$")


def _fail(what: str, e: GithubException) -> PlatformError:
    message = e.data.get("message") if isinstance(e.data, dict) else e.data
    return PlatformError(f"{what}: HTTP {e.status}: {message}")


class GitHubPlatform:
    def __init__(self, gh: Github, repo: str):
        self.gh, self.full_name = gh, repo
        self.owner = repo.split("/", 1)[0]
        self._repo = gh.get_repo(repo)  # (the client is built lazy: no request here)

    @classmethod
    def from_token(cls, token: str, repo: str, base_url: str = "https://api.github.com") -> GitHubPlatform:
        from github import Auth

        return cls(Github(auth=Auth.Token(token), base_url=base_url, lazy=True), repo)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GithubException as e:
            raise _fail(what, e) from None

    # ---- git ----
    def default_branch(self) -> str:
        return self._call("repository", lambda: self.gh.get_repo(self.full_name).default_branch)

    def head_sha(self, ref: str) -> str:
        if _SHA.match(ref):
            return ref
        return self._call(f"ref {ref}", lambda: self._repo.get_git_ref(f"heads/{ref}").object.sha)

    def read_file(self, ref: str, path: str) -> str | None:
        try:
            content = self._repo.get_contents(path, ref=ref)
        except UnknownObjectException:
            return None
        except GithubException as e:
            raise _fail(f"contents of {path}", e) from None
        if isinstance(content, list):
            return None
        return content.decoded_content.decode("utf-8", errors="replace")

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

    def create_check_run(self, head_sha: str, name: str, output: CheckOutput) -> int:
        kwargs = _check_kwargs(output)
        run = self._call("create check run", self._repo.create_check_run, name=name, head_sha=head_sha, **kwargs)
        return int(run.id)

    def update_check_run(self, check_run_id: int, output: CheckOutput) -> None:
        self._call("update check run", lambda: self._repo.get_check_run(check_run_id).edit(**_check_kwargs(output)))


def _check_kwargs(o: CheckOutput) -> dict[str, Any]:
    out: dict[str, Any] = {"title": o.title[:255], "summary": o.summary[:65_535]}
    if o.text:
        out["text"] = o.text[:65_535]
    kwargs: dict[str, Any] = {"status": o.status, "output": out}
    if o.conclusion is not None:
        kwargs["conclusion"] = o.conclusion
    return kwargs
