"""The LOCAL platform: a git repository on disk as the code host (`fusebot demo`, tests), a real `Platform`.

As Renovate's `--platform=local`: branches are real local branches (committed without touching the working tree or
the checked-out branch), and PRs, comments and check runs are records under `.git/fusebot/` (`state.json`), each PR
body also written to `.git/fusebot/pulls/<number>.md`. Every operation is idempotent: a re-run updates the same
branch and the same PR, and commits nothing when nothing changed. The repository's owner is whoever runs it, so every
user has admin permission here.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import git

from bot.github.platform import (
    BranchUpdate,
    CheckOutput,
    CommentRef,
    PlatformError,
    PullInfo,
    PullRequestRef,
    find_marker,
)

log = logging.getLogger(__name__)
LOCAL_REPO = "local"  # the owner/name a local pull request's head and base repository share


@dataclass
class LocalPull:
    number: int
    branch: str
    base: str
    title: str
    key: str
    state: str = "open"


@dataclass
class LocalComment:
    id: int
    issue: int
    body: str


@dataclass
class LocalCheckRun:
    id: int
    head_sha: str
    name: str
    status: str
    conclusion: str | None
    title: str
    summary: str
    text: str
    annotations: list[dict] | None = None
    external_id: str | None = None


class LocalPlatform:
    """A local git repository as the code host. State lives in `.git/fusebot/state.json`."""

    def __init__(self, path: Path):
        try:
            self.repo = git.Repo(path)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError) as e:
            raise PlatformError(f"{path} is not a git repository: {e}") from None
        self.root = Path(self.repo.working_tree_dir or path)
        self.state_dir = Path(self.repo.git_dir) / "fusebot"
        (self.state_dir / "pulls").mkdir(parents=True, exist_ok=True)

    # ---- state ----
    def _load(self) -> dict:
        f = self.state_dir / "state.json"
        state = json.loads(f.read_text()) if f.exists() else {}
        for key in ("pulls", "comments", "check_runs", "reactions"):
            state.setdefault(key, [])
        return state

    def _save(self, state: dict) -> None:
        tmp = self.state_dir / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, self.state_dir / "state.json")

    def pulls(self) -> list[LocalPull]:
        return [LocalPull(**p) for p in self._load()["pulls"]]

    def pull_body(self, number: int) -> str:
        f = self.state_dir / "pulls" / f"{number}.md"
        return f.read_text() if f.exists() else ""

    def comments(self, issue: int) -> list[LocalComment]:
        return [LocalComment(**c) for c in self._load()["comments"] if c["issue"] == issue]

    def check_runs(self) -> list[LocalCheckRun]:
        return [LocalCheckRun(**c) for c in self._load()["check_runs"]]

    # ---- git ----
    def default_branch(self) -> str:
        try:
            return self.repo.active_branch.name
        except TypeError:  # detached HEAD
            return "main"

    def head_sha(self, ref: str) -> str:
        try:
            return self.repo.commit(ref).hexsha
        except (git.BadName, ValueError) as e:
            raise PlatformError(f"no such ref {ref!r}: {e}") from None

    def read_file(self, ref: str, path: str) -> str | None:
        try:
            blob = self.repo.commit(ref).tree / path
        except KeyError:
            return None
        return blob.data_stream.read().decode("utf-8", errors="replace")

    def commit_files(self, branch: str, base_sha: str, files: dict[str, str | None], message: str) -> BranchUpdate:
        """Point `branch` at one commit on `base_sha` holding `files`; no new commit when it already does."""
        try:
            checked_out = not self.repo.head.is_detached and self.repo.active_branch.name == branch
        except TypeError:
            checked_out = False
        if checked_out:
            raise PlatformError(f"{branch} is checked out in {self.root}: switch to another branch first")
        g = self.repo.git
        with tempfile.TemporaryDirectory(prefix="fusebot-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            g.read_tree(base_sha, env=env)
            for path, text in sorted(files.items()):
                if text is None:
                    g.update_index("--force-remove", "--", path, env=env)
                    continue
                blob = Path(tmp) / "blob"
                blob.write_text(text)
                sha = g.hash_object("-w", str(blob))
                g.update_index("--add", "--cacheinfo", f"100644,{sha},{path}", env=env)
            tree = g.write_tree(env=env)
        ref = f"refs/heads/{branch}"
        current = self.repo.commit(ref) if ref in [r.path for r in self.repo.references] else None
        if current is not None and current.tree.hexsha == tree and [p.hexsha for p in current.parents] == [base_sha]:
            return BranchUpdate(branch, current.hexsha, changed=False)
        commit_env = {"GIT_AUTHOR_NAME": "fusebot", "GIT_AUTHOR_EMAIL": "fusebot@localhost",
                      "GIT_COMMITTER_NAME": "fusebot", "GIT_COMMITTER_EMAIL": "fusebot@localhost"}
        sha = g.commit_tree(tree, "-p", base_sha, "-m", message, env={**os.environ, **commit_env})
        g.update_ref(ref, sha)
        log.info("branch %s -> %s", branch, sha[:12])
        return BranchUpdate(branch, sha, changed=True)

    # ---- pull requests, comments, check runs ----
    def upsert_pull_request(self, *, branch: str, base: str, title: str, body: str, key: str) -> PullRequestRef:
        state = self._load()
        found = next((p for p in state["pulls"] if p["branch"] == branch and p["state"] == "open"
                      and find_marker(self.pull_body(p["number"]), "pr") == key), None)
        created = found is None
        if found is None:
            found = asdict(LocalPull(number=len(state["pulls"]) + 1, branch=branch, base=base, title=title, key=key))
            state["pulls"].append(found)
        found.update(title=title, base=base)
        (self.state_dir / "pulls" / f"{found['number']}.md").write_text(body)
        self._save(state)
        return PullRequestRef(found["number"], (self.state_dir / "pulls" / f"{found['number']}.md").as_uri(), created)

    def upsert_comment(self, issue_number: int, kind: str, key: str, body: str) -> CommentRef:
        state = self._load()
        found = next((c for c in state["comments"] if c["issue"] == issue_number
                      and find_marker(c["body"], kind) == key), None)
        if found is None:
            return CommentRef(self.post_comment(issue_number, body), created=True)
        found["body"] = body
        self._save(state)
        return CommentRef(found["id"], created=False)

    def post_comment(self, issue_number: int, body: str) -> int:
        state = self._load()
        comment = asdict(LocalComment(id=len(state["comments"]) + 1, issue=issue_number, body=body))
        state["comments"].append(comment)
        self._save(state)
        return comment["id"]

    def react_to_comment(self, issue_number: int, comment_id: int, content: str) -> None:
        state = self._load()
        state["reactions"].append({"issue": issue_number, "comment": comment_id, "content": content})
        self._save(state)

    def create_check_run(self, head_sha: str, name: str, output: CheckOutput, external_id: str | None = None) -> int:
        state = self._load()
        run = asdict(LocalCheckRun(id=len(state["check_runs"]) + 1, head_sha=head_sha, name=name, status="",
                                   conclusion=None, title="", summary="", text="", external_id=external_id))
        run.update(_output_fields(output))
        state["check_runs"].append(run)
        self._save(state)
        return run["id"]

    def update_check_run(self, check_run_id: int, output: CheckOutput) -> None:
        state = self._load()
        run = next((r for r in state["check_runs"] if r["id"] == check_run_id), None)
        if run is None:
            raise PlatformError(f"no check run {check_run_id}")
        run.update(_output_fields(output))
        self._save(state)

    def find_check_run(self, head_sha: str, name: str) -> int | None:
        found = [r["id"] for r in self._load()["check_runs"] if r["head_sha"] == head_sha and r["name"] == name]
        return max(found) if found else None

    # ---- what the App's features read ----
    def pull(self, number: int) -> PullInfo:
        found = next((p for p in self._load()["pulls"] if p["number"] == number), None)
        if found is None:
            raise PlatformError(f"no pull request {number}")
        return PullInfo(number=number, head_sha=self.head_sha(found["branch"]), head_ref=found["branch"],
                        head_repo=LOCAL_REPO, base_repo=LOCAL_REPO, base_ref=found["base"], state=found["state"],
                        labels=())

    def pull_files(self, number: int) -> list[str]:
        p = self.pull(number)
        return self.repo.git.diff("--name-only", f"{p.base_ref}...{p.head_sha}").splitlines()

    def permission(self, user: str) -> str:
        return "admin"


def _output_fields(o: CheckOutput) -> dict:
    fields = {"status": o.status, "conclusion": o.conclusion, "title": o.title, "summary": o.summary, "text": o.text}
    if o.annotations:
        fields["annotations"] = [a.as_api() for a in o.annotations]
    return fields
