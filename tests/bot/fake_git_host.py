"""A small fake of GitHub's git data, pulls, issue-comment and check-run endpoints: a real HTTP server that PyGithub
talks to through `base_url`. Every request's method and path must be an operation of GitHub's OpenAPI description
(../shared/github/openapi-subset.json) and its JSON body must validate against that operation's request schema; an
invalid request is answered 422 and recorded in `errors`. Responses carry the fields PyGithub reads (not validated).

Only the platform's endpoints are here; the App's fake GitHub (tests/fakes/github_server.py on the bot branch) will
replace this once it serves them.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from openapi_schema_validator import OAS30Validator

SPEC = Path("/work/shared/github/openapi-subset.json")
for _up in Path(__file__).resolve().parents:
    if (_up / "shared/github/openapi-subset.json").exists():
        SPEC = _up / "shared/github/openapi-subset.json"
        break


@functools.cache
def _routes() -> list[tuple[re.Pattern, str, dict]]:
    spec = json.loads(SPEC.read_text())
    out = []
    for template, ops in spec["paths"].items():
        rx = re.sub(r"\{(\w+)\}", lambda m: f"(?P<{m.group(1)}>{'.+' if m.group(1) in ('ref', 'path') else '[^/]+'})",
                    template)
        out.append((re.compile("^" + rx + "$"), template, ops))
    return out


def _sha(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()


class FakeGitHost:
    def __init__(self, repo: str, files: dict[str, str], branch: str = "main"):
        self.repo, self.owner = repo, repo.split("/")[0]
        self.blobs: dict[str, str] = {}
        self.trees: dict[str, dict[str, str]] = {}  # sha -> {path: blob sha}
        self.commits: dict[str, dict] = {}
        self.refs: dict[str, str] = {}
        self.pulls: list[dict] = []
        self.comments: list[dict] = []
        self.check_runs: list[dict] = []
        self.requests: list[tuple[str, str]] = []
        self.errors: list[str] = []
        tree = self._tree({p: self._blob(t) for p, t in files.items()})
        self.refs[f"refs/heads/{branch}"] = self._commit("initial", tree, [])
        self.default_branch = branch
        self._lock = threading.Lock()

    # ---- objects ----
    def _blob(self, text: str) -> str:
        sha = _sha(["blob", text])
        self.blobs[sha] = text
        return sha

    def _tree(self, entries: dict[str, str]) -> str:
        sha = _sha(["tree", sorted(entries.items())])
        self.trees[sha] = dict(entries)
        return sha

    def _commit(self, message: str, tree: str, parents: list[str]) -> str:
        sha = _sha(["commit", message, tree, parents, len(self.commits)])
        self.commits[sha] = {"message": message, "tree": tree, "parents": parents}
        return sha

    def files_at(self, ref: str) -> dict[str, str]:
        sha = self.refs.get(f"refs/heads/{ref}", ref)
        return {p: self.blobs[b] for p, b in self.trees[self.commits[sha]["tree"]].items()}

    # ---- JSON shapes ----
    def _url(self, rest: str) -> str:
        return f"{self.base}/repos/{self.repo}/{rest}"

    def _commit_json(self, sha: str) -> dict:
        c = self.commits[sha]
        return {"sha": sha, "url": self._url(f"git/commits/{sha}"), "message": c["message"],
                "tree": {"sha": c["tree"], "url": self._url(f"git/trees/{c['tree']}")},
                "parents": [{"sha": p, "url": self._url(f"git/commits/{p}")} for p in c["parents"]]}

    def _ref_json(self, ref: str) -> dict:
        return {"ref": ref, "url": self._url(f"git/{ref}"),
                "object": {"sha": self.refs[ref], "type": "commit", "url": self._url(f"git/commits/{self.refs[ref]}")}}

    def _pull_json(self, p: dict) -> dict:
        return {**p, "url": self._url(f"pulls/{p['number']}"), "html_url": f"https://github.test/{self.repo}/pull/"
                f"{p['number']}", "head": {"ref": p["head"], "sha": self.refs[f"refs/heads/{p['head']}"],
                                           "label": f"{self.owner}:{p['head']}"}, "base": {"ref": p["base"]}}

    def _comment_json(self, c: dict) -> dict:
        return {**c, "url": self._url(f"issues/comments/{c['id']}")}

    # ---- dispatch ----
    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        route = next(((m, t, ops) for rx, t, ops in _routes() if (m := rx.match(path))), None)
        if route is None or method.lower() not in route[2]:
            self.errors.append(f"{method} {path}: no such operation in GitHub's API")
            return 404, {"message": "Not Found"}
        match, template, ops = route
        op = ops[method.lower()]
        schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        if schema is not None:
            problems = [e.message for e in OAS30Validator(schema).iter_errors(body)]
            if problems:
                self.errors.append(f"{method} {template}: {problems}")
                return 422, {"message": "Validation Failed", "errors": problems}
        self.requests.append((method, template))
        p = match.groupdict()
        with self._lock:
            return self._serve(method, template, p, query, body)

    def _serve(self, method: str, t: str, p: dict, q: dict, body: Any) -> tuple[int, Any]:  # noqa: C901
        key = (method, t.removeprefix("/repos/{owner}/{repo}"))
        if key == ("GET", ""):
            return 200, {"full_name": self.repo, "name": self.repo.split("/")[1], "default_branch": self.default_branch,
                         "owner": {"login": self.owner}, "url": f"{self.base}/repos/{self.repo}"}
        if key == ("GET", "/git/ref/{ref}"):
            ref = f"refs/{p['ref']}"
            return (200, self._ref_json(ref)) if ref in self.refs else (404, {"message": "Not Found"})
        if key == ("POST", "/git/refs"):
            if body["ref"] in self.refs:
                return 422, {"message": "Reference already exists"}
            self.refs[body["ref"]] = body["sha"]
            return 201, self._ref_json(body["ref"])
        if key == ("PATCH", "/git/refs/{ref}"):
            ref = f"refs/{p['ref']}"
            self.refs[ref] = body["sha"]
            return 200, self._ref_json(ref)
        if key == ("GET", "/git/commits/{commit_sha}"):
            sha = p["commit_sha"]
            return (200, self._commit_json(sha)) if sha in self.commits else (404, {"message": "Not Found"})
        if key == ("POST", "/git/trees"):
            entries = dict(self.trees[body["base_tree"]]) if body.get("base_tree") else {}
            for e in body["tree"]:
                if "content" in e:
                    entries[e["path"]] = self._blob(e["content"])
                elif e.get("sha") is None:
                    entries.pop(e["path"], None)
                else:
                    entries[e["path"]] = e["sha"]
            sha = self._tree(entries)
            return 201, {"sha": sha, "url": self._url(f"git/trees/{sha}"), "tree": []}
        if key == ("POST", "/git/commits"):
            return 201, self._commit_json(self._commit(body["message"], body["tree"], body["parents"]))
        if key == ("GET", "/contents/{path}"):
            files = self.files_at(q.get("ref", self.default_branch))
            if p["path"] not in files:
                return 404, {"message": "Not Found"}
            text = files[p["path"]]
            return 200, {"type": "file", "encoding": "base64", "path": p["path"], "name": p["path"].split("/")[-1],
                         "content": base64.b64encode(text.encode()).decode(), "sha": _sha(["blob", text])}
        if key == ("GET", "/pulls"):
            head = q.get("head", "").split(":")[-1]
            found = [x for x in self.pulls if x["state"] == q.get("state", "open")
                     and (not head or x["head"] == head) and (not q.get("base") or x["base"] == q["base"])]
            return 200, [self._pull_json(x) for x in found]
        if key == ("POST", "/pulls"):
            pull = {"number": len(self.pulls) + len(self.comments) + 100, "state": "open", "title": body["title"],
                    "body": body.get("body", ""), "head": body["head"], "base": body["base"]}
            self.pulls.append(pull)
            return 201, self._pull_json(pull)
        if key == ("PATCH", "/pulls/{pull_number}"):
            pull = next(x for x in self.pulls if x["number"] == int(p["pull_number"]))
            pull.update({k: v for k, v in body.items() if k in ("title", "body", "state")})
            return 200, self._pull_json(pull)
        if key == ("GET", "/issues/{issue_number}/comments"):
            return 200, [self._comment_json(c) for c in self.comments if c["issue"] == int(p["issue_number"])]
        if key == ("POST", "/issues/{issue_number}/comments"):
            c = {"id": 5000 + len(self.comments), "issue": int(p["issue_number"]), "body": body["body"]}
            self.comments.append(c)
            return 201, self._comment_json(c)
        if key == ("PATCH", "/issues/comments/{comment_id}"):
            c = next(x for x in self.comments if x["id"] == int(p["comment_id"]))
            c["body"] = body["body"]
            return 200, self._comment_json(c)
        if key == ("POST", "/check-runs"):
            run = {"id": 9000 + len(self.check_runs), **body}
            self.check_runs.append(run)
            return 201, {**run, "url": self._url(f"check-runs/{run['id']}")}
        if key == ("GET", "/check-runs/{check_run_id}"):
            run = next(x for x in self.check_runs if x["id"] == int(p["check_run_id"]))
            return 200, {**run, "url": self._url(f"check-runs/{run['id']}")}
        if key == ("PATCH", "/check-runs/{check_run_id}"):
            run = next(x for x in self.check_runs if x["id"] == int(p["check_run_id"]))
            run.update(body)
            return 200, {**run, "url": self._url(f"check-runs/{run['id']}")}
        self.errors.append(f"{method} {t}: not served by this fake")
        return 501, {"message": "not served by the fake"}

    # ---- the server ----
    def __enter__(self) -> FakeGitHost:
        host = self

        class Handler(BaseHTTPRequestHandler):
            def _do(self) -> None:
                url = urlparse(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                body = json.loads(raw) if raw else None
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                status, payload = host.handle(self.command, url.path, query, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _do

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
