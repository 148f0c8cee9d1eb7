"""The fake GitHub of tests/fakes/github_server.py, plus what publishing needs (git data, pulls, comment edits), all
backed by the repository's real bare git repository: a branch fusebot creates through the API is a real commit in
that repository, which the test can check out and read.

Every request and response still goes through the base class's validation against GitHub's OpenAPI description.
The workflow's GITHUB_TOKEN is modelled as an installation token of the repository (that is what it is).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.fakes.github_server import NOW, FakeGitHub, Pull, Repo

COMMITTER = {"GIT_AUTHOR_NAME": "github-actions[bot]", "GIT_AUTHOR_EMAIL": "actions@github.invalid",
             "GIT_COMMITTER_NAME": "github-actions[bot]", "GIT_COMMITTER_EMAIL": "actions@github.invalid"}


class ActionGitHub(FakeGitHub):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a git ref is `heads/<branch>`, and a fusebot branch has slashes: `{ref}` spans them, as `{path}` does
        self.spec.routes = [(re.compile(rx.pattern.replace("(?P<ref>[^/]+)", "(?P<ref>.+)")), t)
                            for rx, t in self.spec.routes]
        self.texts: dict[tuple[str, int], dict[str, str]] = {}  # (repo, number) -> title, body
        r = "/repos/{owner}/{repo}"
        self.handlers.update({
            ("GET", f"{r}/git/ref/{{ref}}"): self._get_ref,
            ("POST", f"{r}/git/refs"): self._create_ref,
            ("PATCH", f"{r}/git/refs/{{ref}}"): self._update_ref,
            ("GET", f"{r}/git/commits/{{commit_sha}}"): self._get_commit,
            ("POST", f"{r}/git/commits"): self._create_commit,
            ("POST", f"{r}/git/trees"): self._create_tree,
            ("GET", f"{r}/pulls"): self._list_pulls,
            ("POST", f"{r}/pulls"): self._create_pull,
            ("PATCH", f"{r}/pulls/{{pull_number}}"): self._edit_pull,
            ("GET", f"{r}/issues/{{issue_number}}/comments"): self._list_comments,
            ("PATCH", f"{r}/issues/comments/{{comment_id}}"): self._edit_comment,
            ("GET", f"{r}/check-runs/{{check_run_id}}"): self._get_check_run,
        })

    def grant_token(self, token: str, installation_id: int) -> None:
        self.tokens[token] = installation_id

    # ---- for assertions ----
    def bot_pulls(self, repo: str) -> list[tuple[Pull, dict[str, str]]]:
        return [(p, self.texts[k]) for k, p in self.pulls.items() if k in self.texts and k[0] == repo]

    def files_at(self, repo: str, ref: str) -> dict[str, str]:
        bare = self.repos[repo]
        names = self._git(bare, "ls-tree", "-r", "--name-only", ref).split()
        return {n: self._git(bare, "show", f"{ref}:{n}") for n in names}

    # ---- git data ----
    def _rev(self, repo: Repo, ref: str) -> str | None:
        try:
            return self._git(repo, "rev-parse", "--verify", "-q", ref).strip()
        except subprocess.CalledProcessError:
            return None

    def _ref_json(self, repo: Repo, ref: str, sha: str) -> dict[str, Any]:
        url = f"{self.base_url}/repos/{repo.full_name}"
        return {"ref": ref, "node_id": "x", "url": f"{url}/git/{ref}",
                "object": {"sha": sha, "type": "commit", "url": f"{url}/git/commits/{sha}"}}

    def _get_ref(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        sha = self._rev(repo, f"refs/{p['ref']}")
        if sha is None:
            return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}
        return 200, self._ref_json(repo, f"refs/{p['ref']}", sha)

    def _create_ref(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        if self._rev(repo, body["ref"]) is not None:
            return 422, {"message": "Reference already exists", "documentation_url": "https://docs.github.com/rest"}
        self._git(repo, "update-ref", body["ref"], body["sha"])
        return 201, self._ref_json(repo, body["ref"], body["sha"])

    def _update_ref(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        self._git(repo, "update-ref", f"refs/{p['ref']}", body["sha"])
        return 200, self._ref_json(repo, f"refs/{p['ref']}", body["sha"])

    def _commit_json(self, repo: Repo, sha: str) -> dict[str, Any]:
        tree, parents, message = self._git(repo, "log", "-1", "--format=%T%n%P%n%B", sha).split("\n", 2)
        url = f"{self.base_url}/repos/{repo.full_name}/git"
        person = {"name": "fusebot", "email": "fusebot@example.com", "date": NOW}
        return {"sha": sha, "node_id": "x", "url": f"{url}/commits/{sha}", "html_url": "https://github.com/x",
                "message": message.rstrip("\n"), "author": person, "committer": person,
                "tree": {"sha": tree, "url": f"{url}/trees/{tree}"},
                "parents": [{"sha": s, "url": f"{url}/commits/{s}", "html_url": "https://github.com/x"}
                            for s in parents.split()],
                "verification": {"verified": False, "reason": "unsigned", "signature": None, "payload": None,
                                 "verified_at": None}}

    def _get_commit(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        if self._rev(repo, f"{p['commit_sha']}^{{commit}}") is None:
            return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}
        return 200, self._commit_json(repo, p["commit_sha"])

    def _create_tree(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}

            def git(*args: str, stdin: str | None = None) -> str:
                return subprocess.run(["git", "--git-dir", str(repo.bare), *args], input=stdin, env=env, text=True,
                                      check=True, capture_output=True).stdout.strip()

            if body.get("base_tree"):
                git("read-tree", body["base_tree"])
            for e in body["tree"]:
                if e.get("content") is not None:
                    blob = git("hash-object", "-w", "--stdin", stdin=e["content"])
                    git("update-index", "--add", "--cacheinfo", f"{e['mode']},{blob},{e['path']}")
                elif e.get("sha") is None:
                    git("update-index", "--force-remove", "--", e["path"])
                else:
                    git("update-index", "--add", "--cacheinfo", f"{e['mode']},{e['sha']},{e['path']}")
            sha = git("write-tree")
        return 201, {"sha": sha, "url": f"{self.base_url}/repos/{repo.full_name}/git/trees/{sha}", "truncated": False,
                     "tree": []}

    def _create_commit(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        args = ["commit-tree", body["tree"], *[a for s in body.get("parents", []) for a in ("-p", s)],
                "-m", body["message"]]
        sha = subprocess.run(["git", "--git-dir", str(repo.bare), *args], env={**os.environ, **COMMITTER},
                             text=True, check=True, capture_output=True).stdout.strip()
        return 201, self._commit_json(repo, sha)

    # ---- pulls ----
    def _full_pull(self, pull: Pull) -> dict[str, Any]:
        text = self.texts.get((pull.repo, pull.number), {"title": "A change", "body": ""})
        return {**self._pull_json(pull), **text,
                "html_url": f"https://github.com/{pull.repo}/pull/{pull.number}"}

    def _list_pulls(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        if int(q.get("page", "1")) > 1:
            return 200, []
        head = q.get("head", "").split(":")[-1]
        found = [x for (r, _), x in sorted(self.pulls.items()) if r == repo.full_name
                 and x.state == q.get("state", "open") and (not head or x.head_ref == head)
                 and (not q.get("base") or x.base_ref == q["base"])]
        return 200, [self._full_pull(x) for x in found]

    def _create_pull(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        head_sha, base_sha = self._rev(repo, f"refs/heads/{body['head']}"), self._rev(repo, f"refs/heads/{body['base']}")
        if head_sha is None or base_sha is None:
            return 422, {"message": "Validation Failed", "documentation_url": "https://docs.github.com/rest"}
        number = max([n for (r, n) in self.pulls if r == repo.full_name] + [100]) + 1
        pull = self.add_pull(Pull(repo.full_name, number, head_sha, body["head"], repo.full_name, body["base"],
                                  base_sha, user="github-actions[bot]"))
        self.texts[(repo.full_name, number)] = {"title": body["title"], "body": body.get("body") or ""}
        return 201, self._full_pull(pull)

    def _edit_pull(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        key = (self._repo(p).full_name, int(p["pull_number"]))
        if key not in self.pulls:
            return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}
        text = self.texts.setdefault(key, {"title": "A change", "body": ""})
        text.update({k: body[k] for k in ("title", "body") if k in body})
        return 200, self._full_pull(self.pulls[key])

    # ---- comments, check runs ----
    def _comment_json(self, repo: str, cid: int) -> dict[str, Any]:
        c = self.comments[cid]
        return {"url": f"{self.base_url}/repos/{repo}/issues/comments/{cid}", "id": cid, "body": c["body"],
                "user": self._user(c["user"], "Bot" if c["user"].endswith("[bot]") else "User"),
                "created_at": NOW, "updated_at": NOW, "author_association": "NONE",
                "html_url": f"https://github.com/{repo}/pull/{c['issue']}#issuecomment-{cid}",
                "issue_url": f"https://api.github.com/repos/{repo}/issues/{c['issue']}"}

    def _list_comments(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p).full_name
        if int(q.get("page", "1")) > 1:
            return 200, []
        return 200, [self._comment_json(repo, cid) for cid, c in sorted(self.comments.items())
                     if c["repo"] == repo and c["issue"] == int(p["issue_number"])]

    def _edit_comment(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo, cid = self._repo(p).full_name, int(p["comment_id"])
        if cid not in self.comments or self.comments[cid]["repo"] != repo:
            return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}
        self.comments[cid]["body"] = body["body"]
        return 200, self._comment_json(repo, cid)

    def _get_check_run(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        run = self.check_runs.get(int(p["check_run_id"]))
        if run is None or run["repo"] != self._repo(p).full_name:
            return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}
        return 200, self._check_run_json(run)
