"""The fake GitHub of tests/fakes/github_server.py as a workflow's job sees it: the repository's real bare git
repository behind it (a branch fusebot creates through the API is a real commit there), and the workflow's
GITHUB_TOKEN modelled as what it is, an installation token of the repository. Every request and response still goes
through the fake's validation against GitHub's OpenAPI description."""

from __future__ import annotations

from typing import Any

from tests.fakes.github_server import FakeGitHub, Pull


class ActionGitHub(FakeGitHub):
    def grant_token(self, token: str, installation_id: int) -> None:
        self.tokens[token] = installation_id

    def bot_pulls(self, repo: str) -> list[Pull]:
        """The pull requests fusebot opened."""
        return [p for (r, _), p in sorted(self.pulls.items()) if r == repo and p.user == "fusebot[bot]"]

    def files_at(self, repo: str, ref: str) -> dict[str, str]:
        bare = self.repos[repo]
        names = self._git(bare, "ls-tree", "-r", "--name-only", ref).split()
        return {n: self._git(bare, "show", f"{ref}:{n}") for n in names}

    def refs(self, repo: str) -> str:
        return self._git(self.repos[repo], "for-each-ref")

    def check_run_list(self) -> list[dict[str, Any]]:
        return list(self.check_runs.values())
