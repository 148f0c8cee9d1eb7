"""A fake GitHub REST API: a real HTTP server with in-memory state and real git repositories behind it.

Every request it receives and every response it sends is checked against GitHub's own OpenAPI description
(tests/fixtures/github/openapi-subset.json, OpenAPI 3.0.3, validated with OAS30 read/write validators). A request to
a path or method the description lacks, a request body it rejects, or a response the fake would send that does not
match is recorded in `errors` and answered with an error status; the `fake_github` fixture fails the test when
`errors` is not empty. Responses are built from a few meaningful fields, completed from the response schema by
`fill` (required fields get minimal valid values), then validated.

Authentication is checked as GitHub does it: /app/... needs the App's JWT (RS256, verified with the App's public
key), everything else an installation token that this fake issued, for a repository of that installation, or a
person's token (`user_tokens`: what a maintainer's own client sends; a comment posted with it is theirs).

Times are real, as GitHub writes them (UTC, ISO 8601, whole seconds, `Z`): a comment's or pull request's creation
and last update, a check run's start and completion, a commit's author and committer dates (from the git object).
With `state_file`, what requests create or change (pull requests, comments, reactions, check runs, installation
tokens) is written to that JSON file after each such request and read back at start: a restarted fake keeps them.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
import os
import re
import secrets
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
from openapi_schema_validator import OAS30ReadValidator, OAS30WriteValidator, oas30_format_checker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.serve import serve_in_thread

SPEC_PATH = Path(__file__).resolve().parents[1] / "fixtures" / "github" / "openapi-subset.json"
MISSING: Any = object()


def github_time(when: datetime | None = None) -> str:
    """`when` (default: now) as GitHub's API writes a time: UTC, ISO 8601, whole seconds, `Z`."""
    return (when or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@functools.cache
def load_spec() -> dict[str, Any]:
    return json.loads(SPEC_PATH.read_text())


def validation_errors(schema: dict[str, Any], value: Any, *, write: bool = False) -> list[str]:
    """Errors of `value` against an OAS 3.0 schema. One reading is relaxed: a `nullable` field whose `enum` omits
    null accepts null (GitHub sends `"conclusion": null` for a queued check run; OAS 3.0.3 is ambiguous here)."""
    cls = OAS30WriteValidator if write else OAS30ReadValidator
    v = cls(schema, format_checker=oas30_format_checker)
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message[:300]}"
        for e in v.iter_errors(value)
        if not (e.validator == "enum" and e.instance is None and e.schema.get("nullable"))
    ]


def _merge_all_of(schema: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    props = dict(out.get("properties", {}))
    required = list(out.get("required", []))
    for sub in schema["allOf"]:
        sub = _merge_all_of(sub) if "allOf" in sub else sub
        props.update(sub.get("properties", {}))
        required += [r for r in sub.get("required", []) if r not in required]
        for k in ("type", "nullable"):
            if k in sub:
                out.setdefault(k, sub[k])
    out["properties"], out["required"] = props, required
    return out


def fill(schema: dict[str, Any], value: Any = MISSING) -> Any:
    """`value` completed so it satisfies `schema`: missing required properties get minimal valid values."""
    if "allOf" in schema:
        return fill(_merge_all_of(schema), value)
    for key in ("oneOf", "anyOf"):
        if key in schema:
            for sub in schema[key]:
                cand = fill(sub, value)
                if not validation_errors(sub, cand):
                    return cand
            return fill(schema[key][0], value)
    if value is None:
        return None
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        if value is MISSING and schema.get("nullable"):
            return None
        if value is not MISSING and not isinstance(value, dict):
            return value  # not an object: left as it is, so a oneOf tries its other branches
        out = dict(value) if isinstance(value, dict) else {}
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in out:
                out[name] = fill(props.get(name, {}))
        for name, v in list(out.items()):
            if name in props:
                out[name] = fill(props[name], v)
        return out
    if kind == "array":
        if value is not MISSING and not isinstance(value, list):
            return value  # (a file's object is not a directory listing)
        return [] if value is MISSING else [fill(schema.get("items", {}), x) for x in value]
    if value is not MISSING:
        return value
    if schema.get("nullable"):
        return None
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "string":
        fmt = schema.get("format")
        return {"date-time": github_time(), "uri": "https://github.com/x", "email": "a@example.com"}.get(fmt, "x")
    if kind in ("integer", "number"):
        return max(1, schema.get("minimum", 1))
    if kind == "boolean":
        return False
    return None


class Spec:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.routes = []
        for template in spec["paths"]:
            rx = "^" + re.sub(r"\{(\w+)\}", lambda m: f"(?P<{m.group(1)}>[^/]+)", template) + "$"
            self.routes.append((re.compile(rx), template))
        # `{path}` in contents/{path} and a trailing `{ref}` (git/ref/heads/a/b) span slashes
        self.routes = [
            (re.compile(rx.pattern.replace("(?P<path>[^/]+)", "(?P<path>.+)").replace("(?P<ref>[^/]+)$", "(?P<ref>.+)$")),
             t) for rx, t in self.routes
        ]

    def match(self, path: str) -> tuple[str, dict[str, str]] | None:
        for rx, template in self.routes:
            m = rx.match(path)
            if m:
                return template, m.groupdict()
        return None

    def operation(self, template: str, method: str) -> dict[str, Any] | None:
        return self.spec["paths"][template].get(method.lower())


@dataclass
class Repo:
    full_name: str
    id: int
    installation_id: int
    bare: Path
    default_branch: str = "main"


@dataclass
class Pull:
    repo: str
    number: int
    head_sha: str
    head_ref: str
    head_repo: str | None
    base_ref: str
    base_sha: str
    state: str = "open"
    labels: list[str] = field(default_factory=list)
    user: str = "contributor"
    updated_at: str = "2019-01-01T00:00:00Z"  # before the examples' comments
    created_at: str = "2019-01-01T00:00:00Z"
    title: str = "A change"
    body: str | None = None


@dataclass
class Call:
    method: str
    path: str
    status: int
    body: Any = None


class FakeGitHub:
    def __init__(self, app_id: int, public_key_pem: str, git_root: Path, state_file: Path | None = None) -> None:
        self.app_id = app_id
        self.public_key = public_key_pem
        self.git_root = git_root
        self.spec = Spec(load_spec())
        self.repos: dict[str, Repo] = {}
        self.pulls: dict[tuple[str, int], Pull] = {}
        self.permissions: dict[tuple[str, str], str] = {}
        self.comments: dict[int, dict[str, Any]] = {}
        self.reactions: list[dict[str, Any]] = []
        self.check_runs: dict[int, dict[str, Any]] = {}
        self.tokens: dict[str, int] = {}
        self.user_tokens: dict[str, str] = {}  # a person's token -> their login
        self._caller = "fusebot[bot]"  # who sent the request being handled
        self.calls: list[Call] = []
        self.errors: list[str] = []
        self.fail_next: dict[str, int] = {}  # "METHOD template" -> status to answer once (outage simulation)
        self.outage = 0  # non-zero: answer every request with this status (GitHub down)
        self.latency_s = 0.0  # added to every answer (a slow GitHub)
        self._next_id = 1000
        self._lock = threading.RLock()
        self.state_file = state_file
        self.base_url = ""
        self.handlers: dict[tuple[str, str], Callable[..., tuple[int, Any]]] = {
            ("POST", "/app/installations/{installation_id}/access_tokens"): self._access_token,
            ("GET", "/repos/{owner}/{repo}"): self._get_repo,
            ("GET", "/repos/{owner}/{repo}/branches/{branch}"): self._get_branch,
            ("GET", "/repos/{owner}/{repo}/collaborators/{username}/permission"): self._permission,
            ("GET", "/repos/{owner}/{repo}/contents/{path}"): self._contents,
            ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}"): self._get_pull,
            ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/files"): self._pull_files,
            ("POST", "/repos/{owner}/{repo}/issues/{issue_number}/comments"): self._create_comment,
            ("POST", "/repos/{owner}/{repo}/issues/comments/{comment_id}/reactions"): self._create_reaction,
            ("POST", "/repos/{owner}/{repo}/check-runs"): self._create_check_run,
            ("PATCH", "/repos/{owner}/{repo}/check-runs/{check_run_id}"): self._update_check_run,
            ("GET", "/repos/{owner}/{repo}/commits/{ref}/check-runs"): self._list_check_runs,
            ("GET", "/repos/{owner}/{repo}/check-runs/{check_run_id}/annotations"): self._list_annotations,
            # what the PR publisher uses: git data, pulls, comments found again and edited
            ("GET", "/repos/{owner}/{repo}/git/ref/{ref}"): self._get_ref,
            ("POST", "/repos/{owner}/{repo}/git/refs"): self._create_ref,
            ("PATCH", "/repos/{owner}/{repo}/git/refs/{ref}"): self._update_ref,
            ("GET", "/repos/{owner}/{repo}/git/commits/{commit_sha}"): self._get_commit,
            ("POST", "/repos/{owner}/{repo}/git/trees"): self._create_tree,
            ("POST", "/repos/{owner}/{repo}/git/commits"): self._create_commit,
            ("GET", "/repos/{owner}/{repo}/pulls"): self._list_pulls,
            ("POST", "/repos/{owner}/{repo}/pulls"): self._create_pull,
            ("PATCH", "/repos/{owner}/{repo}/pulls/{pull_number}"): self._update_pull,
            ("GET", "/repos/{owner}/{repo}/issues/{issue_number}/comments"): self._list_comments,
            ("PATCH", "/repos/{owner}/{repo}/issues/comments/{comment_id}"): self._update_comment,
        }
        if state_file is not None and state_file.exists():
            self._load(state_file)

    # ---- state kept on disk (state_file) -------------------------------------------------------------------------

    def _new_id(self) -> int:
        with self._lock:
            self._next_id += 1
            return self._next_id - 1

    def save(self) -> None:
        """Write what requests made (pull requests, comments, reactions, check runs, tokens) to `state_file`."""
        if self.state_file is None:
            return
        with self._lock:
            state = {"next_id": self._next_id, "pulls": [asdict(pr) for pr in self.pulls.values()],
                     "comments": {str(k): v for k, v in self.comments.items()}, "reactions": self.reactions,
                     "check_runs": {str(k): v for k, v in self.check_runs.items()}, "tokens": self.tokens}
            tmp = self.state_file.with_name(self.state_file.name + ".tmp")
            tmp.write_text(json.dumps(state, indent=1))
            tmp.chmod(0o600)  # installation tokens
            os.replace(tmp, self.state_file)

    def _load(self, path: Path) -> None:
        state = json.loads(path.read_text())
        self._next_id = max(self._next_id, state["next_id"])
        self.pulls = {(pr["repo"], pr["number"]): Pull(**pr) for pr in state["pulls"]}
        self.comments = {int(k): v for k, v in state["comments"].items()}
        self.reactions = state["reactions"]
        self.check_runs = {int(k): v for k, v in state["check_runs"].items()}
        self.tokens = state["tokens"]

    # ---- test set-up -----------------------------------------------------------------------------------------

    def add_repo(self, full_name: str, installation_id: int, bare: Path, default_branch: str = "main") -> Repo:
        repo = Repo(full_name, self._new_id(), installation_id, bare, default_branch)
        self.repos[full_name] = repo
        return repo

    def add_pull(self, pull: Pull) -> Pull:
        self.pulls[(pull.repo, pull.number)] = pull
        return pull

    def set_permission(self, repo: str, user: str, permission: str) -> None:
        self.permissions[(repo, user)] = permission

    def add_comment(self, repo: str, issue_number: int, comment_id: int, body: str, user: str) -> None:
        now = github_time()
        self.comments[comment_id] = {"repo": repo, "issue": issue_number, "body": body, "user": user,
                                     "created_at": now, "updated_at": now}

    def clone_url_template(self) -> str:
        return f"file://{self.git_root}/{{repo}}.git"

    def calls_to(self, method: str, fragment: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method and fragment in c.path]

    def comments_on(self, repo: str, issue_number: int) -> list[str]:
        with self._lock:
            return [
                c["body"] for c in self.comments.values()
                if c["repo"] == repo and c["issue"] == issue_number and c["user"] == "fusebot[bot]"
            ]

    # ---- the HTTP layer --------------------------------------------------------------------------------------

    def asgi(self) -> Starlette:
        methods = ["GET", "POST", "PATCH", "PUT", "DELETE"]
        return Starlette(routes=[Route("/{rest:path}", self._endpoint, methods=methods)])

    @contextmanager
    def running(self) -> Iterator[str]:
        with serve_in_thread(self.asgi()) as url:
            self.base_url = url
            yield url

    async def _endpoint(self, request: Request) -> Response:
        body_bytes = await request.body()
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        path, method = request.url.path, request.method
        matched = self.spec.match(path)
        op = self.spec.operation(matched[0], method) if matched else None
        if matched is None or op is None:
            return self._error(f"{method} {path}: not in GitHub's OpenAPI description", 404)
        template, params = matched
        body: Any = None
        if body_bytes:
            try:
                body = json.loads(body_bytes)
            except json.JSONDecodeError:
                return self._error(f"{method} {template}: body is not JSON", 400)
        param_errors = self._check_parameters(op, params, dict(request.query_params))
        if param_errors:
            return self._error(f"{method} {template}: parameters invalid: {param_errors}", 422)
        schema = (((op.get("requestBody") or {}).get("content") or {}).get("application/json") or {}).get("schema")
        if body is not None and schema is None:
            return self._error(f"{method} {template}: sent a body the operation does not take", 400)
        if (op.get("requestBody") or {}).get("required") and body is None:
            return self._error(f"{method} {template}: required body missing", 400)
        if body is not None and schema is not None:
            errs = validation_errors(schema, body, write=True)
            if errs:
                return self._error(f"{method} {template}: request body invalid: {errs[:5]}", 422)
        with self._lock:
            key = f"{method} {template}"
            if self.outage:
                self.calls.append(Call(method, path, self.outage, body))
                return JSONResponse({"message": "simulated outage"}, status_code=self.outage)
            if self.fail_next.get(key):
                status = self.fail_next.pop(key)
                self.calls.append(Call(method, path, status, body))
                return JSONResponse({"message": "simulated outage"}, status_code=status)
            auth_error = self._authorize(request.headers.get("authorization", ""), template, params)
            if auth_error is not None:
                status, payload = auth_error
            else:
                handler = self.handlers.get((method, template))
                if handler is None:
                    return self._error(f"{method} {template}: in the description but not faked", 501)
                credential = request.headers.get("authorization", "").partition(" ")[2]
                self._caller = self.user_tokens.get(credential, "fusebot[bot]")
                status, payload = handler(params, dict(request.query_params), body)
                if method != "GET" and status < 400:
                    self.save()
            self.calls.append(Call(method, path, status, body))
        responses = op["responses"]
        if status == 401 and "401" not in responses:  # "Bad credentials": GitHub answers it on every endpoint
            return JSONResponse(payload, status_code=401)
        if str(status) not in responses:
            return self._error(f"{method} {template}: status {status} is not a documented response", 500)
        content = responses[str(status)].get("content") or {}
        rschema = (content.get("application/json") or {}).get("schema")
        if rschema is not None:
            payload = fill(rschema, payload)
            errs = validation_errors(rschema, payload)
            if errs:
                return self._error(f"{method} {template} -> {status}: response invalid: {errs[:5]}", 500)
        if status == 204:
            return Response(status_code=204)
        return JSONResponse(payload, status_code=status)

    @staticmethod
    def _check_parameters(op: dict[str, Any], path_params: dict[str, str], query: dict[str, str]) -> list[str]:
        """Path and query parameters against the operation's declared ones (names, required, types, enums)."""
        declared = {(p["in"], p["name"]): p for p in op.get("parameters", [])}
        errors = []
        given = [("path", k, v) for k, v in path_params.items()] + [("query", k, v) for k, v in query.items()]
        for where, name, raw in given:
            p = declared.get((where, name))
            if p is None:
                errors.append(f"undeclared {where} parameter {name!r}")
                continue
            schema = p.get("schema", {})
            value: Any = raw
            if schema.get("type") == "integer":
                if not raw.lstrip("-").isdigit():
                    errors.append(f"{name}={raw!r} is not an integer")
                    continue
                value = int(raw)
            elif schema.get("type") == "boolean":
                value = raw == "true"
            errors += [f"{name}: {e}" for e in validation_errors(schema, value, write=True)]
        present = {"path": path_params, "query": query}
        for (where, name), p in declared.items():
            if p.get("required") and where in present and name not in present[where]:
                errors.append(f"required {where} parameter {name!r} missing")
        return errors

    def _error(self, message: str, status: int) -> JSONResponse:
        with self._lock:
            self.errors.append(message)
        return JSONResponse({"message": message}, status_code=status)

    def _authorize(self, header: str, template: str, params: dict[str, str]) -> tuple[int, Any] | None:
        scheme, _, credential = header.partition(" ")
        if template.startswith("/app/"):
            if scheme.lower() != "bearer":
                return 401, {"message": "A JSON web token could not be decoded"}
            try:
                claims = jwt.decode(credential, self.public_key, algorithms=["RS256"])
            except jwt.PyJWTError as e:
                return 401, {"message": f"bad JWT: {e}"}
            if str(claims.get("iss")) != str(self.app_id) or claims["exp"] - claims["iat"] > 660:
                return 401, {"message": "JWT issuer or lifetime invalid"}
            return None
        if scheme.lower() in ("token", "bearer") and credential in self.user_tokens:
            return None  # a person: the repositories here are public
        inst = self.tokens.get(credential) if scheme.lower() in ("token", "bearer") else None
        if inst is None:
            return 401, {"message": "Bad credentials"}
        if "owner" in params:
            repo = self.repos.get(f"{params['owner']}/{params['repo']}")
            if repo is None or repo.installation_id != inst:
                return 404, {"message": "Not Found"}
        return None

    # ---- helpers -----------------------------------------------------------------------------------------

    def _repo(self, p: dict[str, str]) -> Repo:
        return self.repos[f"{p['owner']}/{p['repo']}"]

    def _git(self, repo: Repo, *args: str) -> str:
        return subprocess.run(
            ["git", "--git-dir", str(repo.bare), *args], check=True, capture_output=True, text=True
        ).stdout

    def _repo_json(self, full_name: str | None) -> dict[str, Any] | None:
        if full_name is None:
            return None
        owner, name = full_name.split("/")
        repo = self.repos.get(full_name)
        return {
            "id": repo.id if repo else 1, "name": name, "full_name": full_name,
            "owner": {"login": owner, "id": 1, "type": "User"},
            "default_branch": repo.default_branch if repo else "main",
            "html_url": f"https://github.com/{full_name}", "url": f"{self.base_url}/repos/{full_name}",
            "private": False, "fork": repo is None,
        }

    def _user(self, login: str, kind: str = "User") -> dict[str, Any]:
        return {"login": login, "id": int(hashlib.sha1(login.encode()).hexdigest()[:6], 16), "type": kind}

    # ---- endpoints ---------------------------------------------------------------------------------------

    def _access_token(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        inst = int(p["installation_id"])
        if not any(r.installation_id == inst for r in self.repos.values()):
            return 404, {"message": "Not Found"}
        token = "ghs_" + secrets.token_hex(18)
        self.tokens[token] = inst
        expires = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return 201, {"token": token, "expires_at": expires, "permissions": {}, "repository_selection": "selected"}

    def _get_repo(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        return 200, self._repo_json(self._repo(p).full_name)

    def _get_branch(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        try:
            sha = self._git(repo, "rev-parse", f"refs/heads/{p['branch']}").strip()
        except subprocess.CalledProcessError:
            return 404, {"message": "Branch not found"}
        return 200, {"name": p["branch"], "commit": {"sha": sha}, "protected": False}

    def _permission(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        perm = self.permissions.get((repo.full_name, p["username"]), "read")  # public repo: anyone reads
        role = {"admin": "admin", "write": "write", "read": "read", "none": "none"}[perm]
        return 200, {"permission": perm, "role_name": role, "user": self._user(p["username"])}

    def _contents(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        ref = q.get("ref", repo.default_branch)
        try:
            data = subprocess.run(
                ["git", "--git-dir", str(repo.bare), "show", f"{ref}:{p['path']}"], check=True, capture_output=True
            ).stdout
        except subprocess.CalledProcessError:
            return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}
        name = p["path"].rsplit("/", 1)[-1]
        return 200, {
            "type": "file", "encoding": "base64", "size": len(data), "name": name, "path": p["path"],
            "content": base64.b64encode(data).decode(), "sha": hashlib.sha1(data).hexdigest(),
        }

    def _pull_json(self, pr: Pull) -> dict[str, Any]:
        def side(ref: str, sha: str, repo: str | None) -> dict[str, Any]:
            owner = (repo or "ghost/x").split("/")[0]
            return {"ref": ref, "sha": sha, "label": f"{owner}:{ref}", "repo": self._repo_json(repo),
                    "user": self._user(owner)}

        return {
            "url": f"{self.base_url}/repos/{pr.repo}/pulls/{pr.number}",
            "number": pr.number, "state": pr.state, "id": pr.number + 10_000, "title": pr.title, "body": pr.body,
            "html_url": f"https://github.com/{pr.repo}/pull/{pr.number}",
            "created_at": pr.created_at, "updated_at": pr.updated_at,
            "user": self._user(pr.user),
            "labels": [{"name": n, "id": i + 1, "color": "ededed", "default": False} for i, n in enumerate(pr.labels)],
            "head": side(pr.head_ref, pr.head_sha, pr.head_repo),
            "base": side(pr.base_ref, pr.base_sha, pr.repo),
        }

    def _get_pull(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        pr = self.pulls.get((self._repo(p).full_name, int(p["pull_number"])))
        if pr is None:
            return 404, {"message": "Not Found"}
        return 200, self._pull_json(pr)

    def _pull_files(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        pr = self.pulls[(repo.full_name, int(p["pull_number"]))]
        if int(q.get("page", "1")) > 1:
            return 200, []
        out = self._git(repo, "diff", "--name-status", "-M", f"{pr.base_sha}...{pr.head_sha}")
        files = []
        for line in out.splitlines():
            parts = line.split("\t")
            st = parts[0][0]
            status = {"A": "added", "D": "removed", "M": "modified", "R": "renamed"}.get(st, "changed")
            entry = {"filename": parts[-1], "status": status, "sha": "0" * 40, "additions": 1, "deletions": 0,
                     "changes": 1, "blob_url": "https://github.com/x", "raw_url": "https://github.com/x",
                     "contents_url": "https://api.github.com/x"}
            if st == "R":
                entry["previous_filename"] = parts[1]
            files.append(entry)
        return 200, files

    def _create_comment(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        cid = self._new_id()
        now = github_time()
        self.comments[cid] = {"repo": repo.full_name, "issue": int(p["issue_number"]), "body": body["body"],
                              "user": self._caller, "created_at": now, "updated_at": now}
        return 201, self._comment_json(repo.full_name, cid, self.comments[cid])

    def _create_reaction(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        cid = int(p["comment_id"])
        comment = self.comments.get(cid)
        if comment is None or comment["repo"] != self._repo(p).full_name:
            return 422, {"message": "Validation Failed", "documentation_url": "https://docs.github.com/rest"}
        for r in self.reactions:
            if r["comment_id"] == cid and r["content"] == body["content"]:
                return 200, {"id": r["id"], "content": r["content"], "user": self._user("fusebot[bot]", "Bot")}
        rid = self._new_id()
        self.reactions.append({"id": rid, "comment_id": cid, "content": body["content"]})
        return 201, {"id": rid, "content": body["content"], "user": self._user("fusebot[bot]", "Bot")}

    def _check_run_json(self, run: dict[str, Any]) -> dict[str, Any]:
        return {
            "url": f"{self.base_url}/repos/{run['repo']}/check-runs/{run['id']}",
            "id": run["id"], "head_sha": run["head_sha"], "name": run["name"], "status": run["status"],
            "conclusion": run.get("conclusion"), "external_id": run.get("external_id"),
            "started_at": run.get("started_at"), "completed_at": run.get("completed_at"),
            "output": {"title": run["output"].get("title"), "summary": run["output"].get("summary"),
                       "text": None, "annotations_count": len(run["output"].get("annotations", [])),
                       "annotations_url": "https://api.github.com/x"},
            "app": {"id": self.app_id, "slug": "fusebot", "name": "fusebot", "owner": self._user("fusebot-org")},
            "pull_requests": [], "check_suite": {"id": 77},
        }

    def _create_check_run(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        rid = self._new_id()
        run = {"id": rid, "repo": repo.full_name, "started_at": github_time(), **body, "output": body.get("output", {}),
               "history": []}
        if run.get("conclusion") is not None:
            run["status"] = "completed"
            run.setdefault("completed_at", github_time())
        self.check_runs[rid] = run
        return 201, self._check_run_json(run)

    def _list_check_runs(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        if int(q.get("page", "1")) > 1:
            return 200, {"total_count": 0, "check_runs": []}
        try:
            sha = self._git(repo, "rev-parse", "--verify", f"{p['ref']}^{{commit}}").strip()
        except subprocess.CalledProcessError:
            return 404, {"message": "No commit found for SHA", "documentation_url": "https://docs.github.com/rest"}
        runs = [self._check_run_json(r) for _, r in sorted(self.check_runs.items())
                if r["repo"] == repo.full_name and r["head_sha"] == sha
                and q.get("check_name", r["name"]) == r["name"]]
        return 200, {"total_count": len(runs), "check_runs": runs}

    def _list_annotations(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        run = self.check_runs.get(int(p["check_run_id"]))
        if run is None or run["repo"] != self._repo(p).full_name or int(q.get("page", "1")) > 1:
            return 200, []
        return 200, [{**a, "blob_href": "https://github.com/x", "start_column": None, "end_column": None,
                      "title": None, "raw_details": None} for a in run["output"].get("annotations", [])]

    def _update_check_run(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        run = self.check_runs.get(int(p["check_run_id"]))
        if run is None or run["repo"] != self._repo(p).full_name:
            return 404, {"message": "Not Found"}  # not documented for PATCH: the validator flags it
        run["history"].append({k: run.get(k) for k in ("status", "conclusion")})
        run.update({k: v for k, v in body.items() if k != "output"})
        if "output" in body:
            run["output"] = body["output"]
        if run.get("conclusion") is not None:
            run["status"] = "completed"
        if run["status"] == "completed" and not run.get("completed_at"):
            run["completed_at"] = github_time()
        return 200, self._check_run_json(run)

    # ---- git data, pulls and comments (the PR publisher) ------------------------------------------------------

    def _ref_json(self, repo: Repo, ref: str, sha: str) -> dict[str, Any]:
        url = f"{self.base_url}/repos/{repo.full_name}"
        return {"ref": ref, "node_id": "REF_" + sha[:8], "url": f"{url}/git/{ref}",
                "object": {"type": "commit", "sha": sha, "url": f"{url}/git/commits/{sha}"}}

    def _get_ref(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        try:
            sha = self._git(repo, "rev-parse", "--verify", f"refs/{p['ref']}^{{commit}}").strip()
        except subprocess.CalledProcessError:
            return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}
        return 200, self._ref_json(repo, f"refs/{p['ref']}", sha)

    def _create_ref(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        if subprocess.run(["git", "--git-dir", str(repo.bare), "rev-parse", "--verify", "-q", body["ref"]],
                          capture_output=True).returncode == 0:
            return 422, {"message": "Reference already exists", "documentation_url": "https://docs.github.com/rest"}
        self._git(repo, "update-ref", body["ref"], body["sha"])
        return 201, self._ref_json(repo, body["ref"], body["sha"])

    def _update_ref(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        ref = f"refs/{p['ref']}"
        old = self._git(repo, "rev-parse", ref).strip()
        ahead = subprocess.run(["git", "--git-dir", str(repo.bare), "merge-base", "--is-ancestor", old, body["sha"]],
                               capture_output=True).returncode == 0
        if not ahead and not body.get("force"):
            return 422, {"message": "Update is not a fast forward", "documentation_url": "https://docs.github.com/rest"}
        self._git(repo, "update-ref", ref, body["sha"])
        return 200, self._ref_json(repo, ref, body["sha"])

    def _commit_json(self, repo: Repo, sha: str) -> dict[str, Any]:
        raw = self._git(repo, "cat-file", "commit", sha)
        head, _, message = raw.partition("\n\n")
        fields = [line.split(" ", 1) for line in head.splitlines()]
        tree = next(v for k, v in fields if k == "tree")
        url = f"{self.base_url}/repos/{repo.full_name}/git"
        author, committer = (_person(next(v for k, v in fields if k == role)) for role in ("author", "committer"))
        return {"sha": sha, "node_id": "C_" + sha[:8], "url": f"{url}/commits/{sha}",
                "html_url": f"https://github.com/{repo.full_name}/commit/{sha}", "message": message,
                "author": author, "committer": committer, "tree": {"sha": tree, "url": f"{url}/trees/{tree}"},
                "parents": [{"sha": v, "url": f"{url}/commits/{v}", "html_url": "https://github.com/x"}
                            for k, v in fields if k == "parent"],
                "verification": {"verified": False, "reason": "unsigned", "signature": None, "payload": None}}

    def _get_commit(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        try:
            return 200, self._commit_json(repo, p["commit_sha"])
        except subprocess.CalledProcessError:
            return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}

    def _create_tree(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
            git = lambda *a, stdin=None: subprocess.run(["git", "--git-dir", str(repo.bare), *a], env=env,  # noqa: E731
                                                        input=stdin, check=True, capture_output=True).stdout
            if body.get("base_tree"):
                git("read-tree", body["base_tree"])
            for e in body["tree"]:
                if "content" in e:
                    blob = git("hash-object", "-w", "--stdin", stdin=e["content"].encode()).decode().strip()
                    git("update-index", "--add", "--cacheinfo", f"{e['mode']},{blob},{e['path']}")
                elif e.get("sha") is None:  # a deletion (`--force-remove` needs a work tree; mode 0 does not)
                    git("update-index", "--index-info", stdin=f"0 {'0' * 40}\t{e['path']}\n".encode())
                else:
                    git("update-index", "--add", "--cacheinfo", f"{e['mode']},{e['sha']},{e['path']}")
            sha = git("write-tree").decode().strip()
        return 201, {"sha": sha, "url": f"{self.base_url}/repos/{repo.full_name}/git/trees/{sha}", "truncated": False,
                     "tree": []}

    def _create_commit(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        env = {**os.environ, "GIT_AUTHOR_NAME": "fusebot[bot]", "GIT_AUTHOR_EMAIL": "bot@example.com",
               "GIT_COMMITTER_NAME": "fusebot[bot]", "GIT_COMMITTER_EMAIL": "bot@example.com"}
        parents = [a for sha in body.get("parents", []) for a in ("-p", sha)]
        sha = subprocess.run(["git", "--git-dir", str(repo.bare), "commit-tree", body["tree"], *parents, "-m",
                              body["message"]], env=env, check=True, capture_output=True, text=True).stdout.strip()
        return 201, self._commit_json(repo, sha)

    def _list_pulls(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        if int(q.get("page", "1")) > 1:
            return 200, []
        state, head, base = q.get("state", "open"), q.get("head"), q.get("base")
        found = [pr for (name, _), pr in sorted(self.pulls.items()) if name == repo.full_name
                 and (state == "all" or pr.state == state)
                 and (head is None or f"{(pr.head_repo or '').split('/')[0]}:{pr.head_ref}" == head)
                 and (base is None or pr.base_ref == base)]
        return 200, [self._pull_json(pr) for pr in found]

    def _create_pull(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        try:
            head_sha = self._git(repo, "rev-parse", f"refs/heads/{body['head']}").strip()
            base_sha = self._git(repo, "rev-parse", f"refs/heads/{body['base']}").strip()
        except subprocess.CalledProcessError:
            return 422, {"message": "Validation Failed", "documentation_url": "https://docs.github.com/rest"}
        if any(x.repo == repo.full_name and x.head_ref == body["head"] and x.state == "open" for x in self.pulls.values()):
            return 422, {"message": "A pull request already exists", "documentation_url": "https://docs.github.com/rest"}
        number = max([n for (name, n) in self.pulls if name == repo.full_name] + [0]) + 1
        now = github_time()
        pr = self.add_pull(Pull(repo=repo.full_name, number=number, head_sha=head_sha, head_ref=body["head"],
                                head_repo=repo.full_name, base_ref=body["base"], base_sha=base_sha,
                                user="fusebot[bot]", title=body["title"], body=body.get("body"), created_at=now,
                                updated_at=now))
        return 201, self._pull_json(pr)

    def _update_pull(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        pr = self.pulls.get((self._repo(p).full_name, int(p["pull_number"])))
        if pr is None:
            return 404, {"message": "Not Found"}
        for key in ("title", "body", "state"):
            if key in body:
                setattr(pr, key, body[key])
        pr.updated_at = github_time()
        return 200, self._pull_json(pr)

    def _comment_json(self, repo: str, cid: int, c: dict[str, Any]) -> dict[str, Any]:
        return {"url": f"{self.base_url}/repos/{repo}/issues/comments/{cid}", "id": cid, "body": c["body"],
                "user": self._user(c["user"], "Bot" if c["user"].endswith("[bot]") else "User"),
                "created_at": c["created_at"], "updated_at": c.get("updated_at", c["created_at"]),
                "author_association": "NONE" if c["user"].endswith("[bot]") else "MEMBER",
                "html_url": f"https://github.com/{repo}/pull/{c['issue']}#issuecomment-{cid}",
                "issue_url": f"https://api.github.com/repos/{repo}/issues/{c['issue']}"}

    def _list_comments(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        if int(q.get("page", "1")) > 1:
            return 200, []
        return 200, [self._comment_json(repo.full_name, cid, c) for cid, c in sorted(self.comments.items())
                     if c["repo"] == repo.full_name and c["issue"] == int(p["issue_number"])]

    def _update_comment(self, p: dict[str, str], q: dict[str, str], body: Any) -> tuple[int, Any]:
        repo = self._repo(p)
        c = self.comments.get(int(p["comment_id"]))
        if c is None or c["repo"] != repo.full_name:
            return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}
        c["body"], c["updated_at"] = body["body"], github_time()
        return 200, self._comment_json(repo.full_name, int(p["comment_id"]), c)


def _person(line: str) -> dict[str, str]:
    """A git commit's `author`/`committer` value (`Name <email> 1700000000 +0000`) as GitHub's API shows it."""
    name_email, stamp, _zone = line.rsplit(" ", 2)
    name, _, email = name_email.partition(" <")
    return {"name": name, "email": email.rstrip(">"), "date": github_time(datetime.fromtimestamp(int(stamp), UTC))}
