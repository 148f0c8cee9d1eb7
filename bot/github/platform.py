"""The seam between fusebot and a code host: the `Platform` interface and the plain data that crosses it.

Everything fusebot does on a code host goes through one `Platform`: read files and refs, commit files on a branch,
find-or-create a PR by branch and hidden marker, find-or-update a comment by marker, create and update check runs,
and what the App's features ask of a pull request (its head, its files, its body, a writer's permission, comments
and reactions). Two real implementations, as httpx has transports: bot/github/github_platform.py (GitHub's REST API
through PyGithub) and bot/github/local_platform.py (a git repository on disk, for `fusebot demo` and tests).

Hidden markers (`<!-- fusebot:pr key=... -->`) are part of the seam: they are how a platform finds fusebot's own PRs
and comments again, so a re-run updates them in place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

WRITE_PERMISSIONS = frozenset({"admin", "maintain", "write"})
_MARKER = re.compile(r"<!-- fusebot:(?P<kind>[a-z-]+) key=(?P<key>[^ ]+) -->")


class PlatformError(Exception):
    """The platform refused an operation or could not be reached (a broken machine, not data)."""


def marker(kind: str, key: str) -> str:
    """The hidden marker by which a PR or comment of this kind and key is found again."""
    if " " in key or "--" in key:
        raise ValueError(f"marker key must have no spaces or '--': {key!r}")
    return f"<!-- fusebot:{kind} key={key} -->"


def find_marker(body: str | None, kind: str) -> str | None:
    """The key of the first `kind` marker in body, or None."""
    for m in _MARKER.finditer(body or ""):
        if m.group("kind") == kind:
            return m.group("key")
    return None


@dataclass(frozen=True)
class BranchUpdate:
    branch: str
    sha: str
    changed: bool  # False: the branch already held exactly these files on this base


@dataclass(frozen=True)
class PullRequestRef:
    number: int
    url: str
    created: bool


@dataclass(frozen=True)
class CommentRef:
    id: int
    created: bool


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
    """A check-run annotation at a repository file's line."""

    path: str
    line: int
    message: str
    level: str = "failure"  # notice, warning, failure

    def as_api(self) -> dict[str, Any]:
        return {"path": self.path, "start_line": self.line, "end_line": self.line, "annotation_level": self.level,
                "message": self.message}


@dataclass(frozen=True)
class CheckOutput:
    """What a check run shows. `actions` are its buttons (None: leave them as they are)."""

    status: str  # queued, in_progress, completed
    title: str
    summary: str
    conclusion: str | None = None  # success, neutral, failure, cancelled (completed only)
    text: str = ""
    annotations: tuple[Annotation, ...] = ()
    actions: tuple[dict[str, str], ...] | None = field(default=None)


class Platform(Protocol):
    """The part of a code host fusebot needs. Paths are relative to the repository root; a file whose text is None
    is removed. Every method raises PlatformError when the host refuses or cannot be reached."""

    # ---- git ----
    def default_branch(self) -> str: ...

    def head_sha(self, ref: str) -> str: ...

    def read_file(self, ref: str, path: str) -> str | None: ...

    def commit_files(self, branch: str, base_sha: str, files: dict[str, str | None], message: str) -> BranchUpdate: ...

    # ---- pull requests, comments, check runs ----
    def upsert_pull_request(self, *, branch: str, base: str, title: str, body: str, key: str) -> PullRequestRef: ...

    def upsert_comment(self, issue_number: int, kind: str, key: str, body: str) -> CommentRef: ...

    def post_comment(self, issue_number: int, body: str) -> int: ...

    def react_to_comment(self, issue_number: int, comment_id: int, content: str) -> None: ...

    def create_check_run(self, head_sha: str, name: str, output: CheckOutput, external_id: str | None = None) -> int: ...

    def update_check_run(self, check_run_id: int, output: CheckOutput) -> None: ...

    def find_check_run(self, head_sha: str, name: str) -> int | None: ...

    # ---- what the App's features read ----
    def pull(self, number: int) -> PullInfo: ...

    def pull_files(self, number: int) -> list[str]: ...

    def pull_body(self, number: int) -> str: ...

    def permission(self, user: str) -> str: ...


def can_write(platform: Platform, user: str) -> bool:
    """Whether `user` may start fusebot's work on the repository (admin, maintain or write)."""
    return platform.permission(user) in WRITE_PERMISSIONS
