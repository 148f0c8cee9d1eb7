"""The only module that talks to GitHub: PyGithub against a configurable base URL.

`GitHubApp` turns the App's JWT into per-installation clients (tokens refreshed by PyGithub); the functions below are
small, take a client and plain data, and return plain data, so handlers never hold PyGithub objects.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from github import Auth, Github, GithubException, UnknownObjectException
from github.GithubRetry import GithubRetry

log = logging.getLogger(__name__)

WRITE_PERMISSIONS = frozenset({"admin", "maintain", "write"})


class GitHubError(Exception):
    """GitHub answered with an error or could not be reached (a broken machine, not data)."""


@dataclass(frozen=True)
class PullInfo:
    number: int
    head_sha: str
    head_ref: str
    head_repo: str | None  # owner/name of the head repository (None: deleted fork)
    base_repo: str
    base_ref: str
    state: str
    labels: tuple[str, ...]
    updated_at: datetime | None = None  # aware UTC

    @property
    def is_fork(self) -> bool:
        return self.head_repo != self.base_repo


@dataclass(frozen=True)
class Annotation:
    path: str
    line: int
    message: str
    level: str = "failure"  # notice, warning, failure

    def as_api(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "start_line": self.line,
            "end_line": self.line,
            "annotation_level": self.level,
            "message": self.message,
        }


class GitHubApp:
    """The App's identity: JWT from app id + private key; cached installation clients."""

    def __init__(
        self,
        app_id: int,
        private_key: str,
        base_url: str,
        *,
        git_url_template: str,
        seconds_between_requests: float = 0.25,
        seconds_between_writes: float = 1.0,
        retries: int = 3,
        timeout_seconds: int = 15,
    ) -> None:
        self._app_auth = Auth.AppAuth(app_id, private_key)
        self.base_url = base_url.rstrip("/")
        self.git_url_template = git_url_template
        self._kw: dict[str, Any] = {
            "base_url": self.base_url,
            "timeout": timeout_seconds,
            "retry": GithubRetry(total=retries, backoff_factor=0.2) if retries else None,
            "seconds_between_requests": seconds_between_requests,
            "seconds_between_writes": seconds_between_writes,
            "lazy": True,
        }
        self._clients: dict[int, tuple[Github, Auth.AppInstallationAuth]] = {}
        self._lock = threading.Lock()

    def client(self, installation_id: int) -> Github:
        return self._entry(installation_id)[0]

    def token(self, installation_id: int) -> str:
        """A live installation token (for git over HTTPS). Never log it."""
        try:
            return self._entry(installation_id)[1].token
        except GithubException as e:
            raise GitHubError(f"installation token for {installation_id}: HTTP {e.status}") from None

    def clone_url(self, installation_id: int, repo: str) -> str:
        token = self.token(installation_id) if "{token}" in self.git_url_template else ""
        return self.git_url_template.format(token=token, repo=repo)

    def _entry(self, installation_id: int) -> tuple[Github, Auth.AppInstallationAuth]:
        with self._lock:
            entry = self._clients.get(installation_id)
            if entry is None:
                auth = self._app_auth.get_installation_auth(installation_id)
                entry = (Github(auth=auth, **self._kw), auth)
                self._clients[installation_id] = entry
            return entry


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except GithubException as e:
        message = e.data.get("message") if isinstance(e.data, dict) else e.data
        raise GitHubError(f"{what}: HTTP {e.status}: {message}") from None


def permission(gh: Github, repo: str, user: str) -> str:
    """The user's permission on the repository: admin, write, read or none (the collaborator permission API)."""
    try:
        return gh.get_repo(repo).get_collaborator_permission(user)
    except UnknownObjectException:
        return "none"  # not a user GitHub knows as a collaborator
    except GithubException as e:
        raise GitHubError(f"permission of {user} on {repo}: HTTP {e.status}") from None


def can_write(gh: Github, repo: str, user: str) -> bool:
    return permission(gh, repo, user) in WRITE_PERMISSIONS


def react_to_comment(gh: Github, repo: str, issue_number: int, comment_id: int, content: str) -> None:
    comment = gh.get_repo(repo).get_issue(issue_number).get_comment(comment_id)
    _call("reaction", comment.create_reaction, content)


def post_comment(gh: Github, repo: str, issue_number: int, body: str) -> int:
    comment = _call("comment", gh.get_repo(repo).get_issue(issue_number).create_comment, body)
    return int(comment.id)


def pull(gh: Github, repo: str, number: int) -> PullInfo:
    def read() -> PullInfo:
        pr = gh.get_repo(repo).get_pull(number)  # lazy: the first attribute read fetches it
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

    return _call(f"pull request {number}", read)


def pull_files(gh: Github, repo: str, number: int) -> list[str]:
    """Paths the PR changes (renamed files under both names)."""
    files = _call("pull files", lambda: list(gh.get_repo(repo).get_pull(number).get_files()))
    out: list[str] = []
    for f in files:
        out.append(f.filename)
        if f.previous_filename:
            out.append(f.previous_filename)
    return out


def file_text(gh: Github, repo: str, path: str, ref: str) -> str | None:
    """A file's text at `ref`, or None when it does not exist."""
    try:
        content = gh.get_repo(repo).get_contents(path, ref=ref)
    except UnknownObjectException:
        return None
    except GithubException as e:
        raise GitHubError(f"contents of {path}: HTTP {e.status}") from None
    if isinstance(content, list):
        return None  # a directory
    return content.decoded_content.decode("utf-8", errors="replace")


def default_branch_head(gh: Github, repo: str) -> tuple[str, str]:
    """(default branch name, its head commit sha)."""
    def read() -> tuple[str, str]:
        r = gh.get_repo(repo)
        name = r.default_branch
        return name, r.get_branch(name).commit.sha

    return _call(f"default branch of {repo}", read)


def create_check_run(
    gh: Github,
    repo: str,
    *,
    name: str,
    head_sha: str,
    status: str,
    title: str,
    summary: str,
    conclusion: str | None = None,
    external_id: str | None = None,
    annotations: list[Annotation] | None = None,
    actions: list[dict[str, str]] | None = None,
) -> int:
    kwargs: dict[str, Any] = {"name": name, "head_sha": head_sha, "status": status}
    if actions is not None:
        kwargs["actions"] = actions
    kwargs["output"] = _output(title, summary, annotations)
    if conclusion is not None:
        kwargs["conclusion"] = conclusion
    if external_id is not None:
        kwargs["external_id"] = external_id
    run = _call("create check run", gh.get_repo(repo).create_check_run, **kwargs)
    return int(run.id)


def update_check_run(
    gh: Github,
    repo: str,
    check_run_id: int,
    *,
    status: str,
    title: str,
    summary: str,
    conclusion: str | None = None,
    annotations: list[Annotation] | None = None,
    actions: list[dict[str, str]] | None = None,
) -> None:
    kwargs: dict[str, Any] = {"status": status, "output": _output(title, summary, annotations)}
    if actions is not None:
        kwargs["actions"] = actions
    if conclusion is not None:
        kwargs["conclusion"] = conclusion
    _call("update check run", gh.get_repo(repo).get_check_run(check_run_id).edit, **kwargs)


def _output(title: str, summary: str, annotations: list[Annotation] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"title": title[:255], "summary": summary[:65_000]}
    if annotations:
        out["annotations"] = [a.as_api() for a in annotations[:50]]  # GitHub takes 50 per request
    return out
