"""Shared test helpers: keys, a git repository with marked modules, real webhook payloads adapted to it."""

from __future__ import annotations

import copy
import functools
import json
import re
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.github.webhooks import sign
from tests.fakes.github_server import load_spec, validation_errors

EXAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "github" / "webhook-examples"
REPO = "Codertocat/Hello-World"  # the repository the examples are about
INSTALLATION = 1
WEBHOOK_SECRET = "whsec-test-0123456789abcdef"
RUNNER_TOKENS = {"gpu-a": "runner-a-token-0123456789", "gpu-b": "runner-b-token-9876543210"}
APP_ID = 4242


@functools.cache
def rsa_keys() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    return private, public


# shared/github/README.md lists these as the examples' only differences from the current schemas.
KNOWN_DIFFERENCES: dict[str, list[str]] = {
    "pull_request": [r"^pull_request/(base|head)/repo: 'has_discussions' is a required property$"],
    "pull_request_review": [r"^pull_request/(base|head)/repo: 'has_discussions' is a required property$"],
    "push": [r"^repository: 'has_discussions' is a required property$"],
    "installation": [r"^installation/(created|updated)_at: \d+ is not of type 'string'$",
                     r"^installation: 'app_slug' is a required property$"],
    "installation_repositories": [r"^installation/(created|updated)_at: \d+ is not of type 'string'$",
                                  r"^installation: 'app_slug' is a required property$"],
    "check_run.rerequested": [
        r"^check_run/(check_suite/)?app/(created|updated)_at: '[\d: -]+' is not a 'date-time'$",
        r"^check_run/(check_suite/)?app: '(permissions|events)' is a required property$",
        r"^check_run: '(node_id|details_url)' is a required property$",
        r"^repository: 'disabled' is a required property$",
    ],
    "check_run.requested_action": [r"^check_run/(check_suite/)?conclusion: None is not one of"],
}


def unexpected_differences(example_name: str, errors: list[str]) -> list[str]:
    """Schema errors of a payload that the README's table of known differences does not explain."""
    parts = example_name.split(".")
    allowed = KNOWN_DIFFERENCES.get(parts[0], []) + KNOWN_DIFFERENCES.get(".".join(parts[:2]), [])
    return [e for e in errors if not any(re.search(p, e) for p in allowed)]


def check_payload(event: str, payload: dict[str, Any]) -> None:
    """A payload a test is about to post still matches GitHub's schema for it (bar the known differences)."""
    action = payload.get("action")
    key = event.replace("_", "-") + (f"-{action.replace('_', '-')}" if action else "")
    hooks = load_spec()["x-webhooks"]
    if key not in hooks:
        return  # e.g. fusebot's internal events
    schema = hooks[key]["post"]["requestBody"]["content"]["application/json"]["schema"]
    bad = unexpected_differences(f"{event}.{action}", validation_errors(schema, payload))
    assert bad == [], f"test payload for {key} does not match GitHub's schema: {bad[:5]}"


def example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / f"{name}.payload.json").read_text())


def signed_headers(event: str, body: bytes, delivery: str | None = None, secret: str = WEBHOOK_SECRET) -> dict:
    return {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": sign(body, secret.encode()),
        "Content-Type": "application/json",
    }


MODULE = '''import torch
from torch import nn


# fusebot: optimize
class {cls}(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, D]
        return torch.relu(self.proj(x)){extra}


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return [64]
'''


ROW_GAIN = Path(__file__).resolve().parents[2] / "examples" / "row_gain.py"
ROW_GAIN_SIZES = "rows, cols = 1024, 512"


def row_gain_source() -> str:
    """examples/row_gain.py at a quarter of its rows and columns, for the end-to-end flows: they assert the flow, and
    each of the module's calls (eager's dense [N, N] @ [N, M] matmul: N * N * M multiplies) runs in every trial,
    baseline, confirmation round, drop-in test and bench script round, so a 1024-row call (tens of milliseconds on a
    shared CPU) costs 64 times the 256-row one. Its kernel still does N times fewer multiplies than eager."""
    text = ROW_GAIN.read_text()
    assert ROW_GAIN_SIZES in text, "examples/row_gain.py's sizes moved: update ROW_GAIN_SIZES"
    return text.replace(ROW_GAIN_SIZES, "rows, cols = 256, 128")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd, check=True, capture_output=True, text=True,
    ).stdout.strip()


@dataclass
class GitRepo:
    """A working repository pushing to a bare one under root/<owner>/<name>.git (what the fake clones from)."""

    work: Path
    bare: Path

    @classmethod
    def create(cls, root: Path, full_name: str) -> GitRepo:
        bare = root / f"{full_name}.git"
        bare.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
        work = root / "work" / full_name
        work.mkdir(parents=True)
        git(work, "init", "-q", "-b", "main")
        git(work, "remote", "add", "origin", str(bare))
        return cls(work, bare)

    def commit(self, files: dict[str, str | None], message: str = "change", branch: str = "main") -> str:
        current = git(self.work, "symbolic-ref", "--short", "HEAD")
        if current != branch:
            exists = subprocess.run(
                ["git", "rev-parse", "--verify", "-q", branch], cwd=self.work, capture_output=True
            ).returncode == 0
            if exists:
                git(self.work, "checkout", "-q", branch)
            else:  # new branches start from main (the initial commit for main itself)
                start = ("main",) if self._has_main() else ()
                git(self.work, "checkout", "-q", "-b", branch, *start)
        for rel, text in files.items():
            p = self.work / rel
            if text is None:
                p.unlink()
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        git(self.work, "add", "-A")
        git(self.work, "commit", "-q", "--allow-empty", "-m", message)
        sha = git(self.work, "rev-parse", "HEAD")
        git(self.work, "push", "-q", "--force", "origin", f"{branch}:refs/heads/{branch}")
        return sha

    def _has_main(self) -> bool:
        return subprocess.run(["git", "rev-parse", "--verify", "-q", "main"], cwd=self.work,
                              capture_output=True).returncode == 0

    def push_ref(self, sha: str, ref: str) -> None:
        git(self.work, "push", "-q", "--force", "origin", f"{sha}:{ref}")


def initial_files() -> dict[str, str]:
    return {
        "models/attn.py": MODULE.format(cls="Attention", extra=""),
        "models/mlp.py": MODULE.format(cls="MLP", extra=""),
        "models/plain.py": "class Plain:\n    pass\n",
        "README.md": "# hello\n",
    }


def pr_payload(
    action: str,
    *,
    number: int,
    head_sha: str,
    base_sha: str,
    head_ref: str = "feature",
    label: str | None = None,
    labels: list[str] | None = None,
    sender: str = "maintainer",
    fork: bool = False,
    state: str = "open",
) -> dict[str, Any]:
    """A real pull_request example, pointed at our repository and commits."""
    d = copy.deepcopy(example(f"pull_request.{action}"))
    pr = d["pull_request"]
    pr["number"], pr["state"] = number, state
    d["number"] = number
    pr["head"]["sha"], pr["head"]["ref"], pr["base"]["sha"] = head_sha, head_ref, base_sha
    if fork:
        pr["head"]["repo"]["full_name"] = "forker/Hello-World"
        pr["head"]["repo"]["fork"] = True
    if label is not None:
        d["label"]["name"] = label
    if labels is not None:
        template = pr["labels"][0] if pr.get("labels") else {"id": 1, "node_id": "x", "url": "u", "color": "c",
                                                               "default": False, "description": None}
        pr["labels"] = [{**template, "name": n} for n in labels]
    d["sender"]["login"] = sender
    d["installation"] = {"id": INSTALLATION, "node_id": "MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9uMQ=="}
    return d


def comment_payload(body: str, *, number: int, comment_id: int, sender: str = "maintainer") -> dict[str, Any]:
    """issue_comment.created on a pull request (the examples are on issues: add `issue.pull_request`)."""
    d = copy.deepcopy(example("issue_comment.created.with-installation"))
    d["issue"]["number"] = number
    d["issue"]["pull_request"] = {"url": f"https://api.github.com/repos/{REPO}/pulls/{number}"}
    d["comment"]["body"], d["comment"]["id"] = body, comment_id
    d["sender"]["login"] = sender
    d["sender"]["type"] = "User"
    d["installation"]["id"] = INSTALLATION
    return d
