"""A repository as GitHub Actions would present it to `fusebot action`: the fake GitHub serving it (its origin a local
bare repository), a checkout as the workspace, the event payload on disk and the environment GitHub sets for the
trigger. Payloads: the real `pull_request.labeled` example; `schedule` and `workflow_dispatch` (no examples exist in
the fixtures) written after GitHub's docs: the cron string or the dispatch's inputs and ref, with the repository
and sender objects of a real payload."""

from __future__ import annotations

import copy
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.contract import Job, JobResult, TargetResult
from tests.bot.action_fake import ActionGitHub
from tests.bot.helpers import INSTALLATION, REPO, GitRepo, example, git, initial_files, pr_payload

# What a GITHUB_TOKEN looks like (an installation token of the repository, `ghs_` and 36 characters).
TOKEN = "ghs_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
LABEL = "optimize-kernels"
RUN_ID = "8675309"


def repository_object(default_branch: str = "main") -> dict[str, Any]:
    repo = copy.deepcopy(example("pull_request.labeled")["repository"])
    repo["default_branch"] = default_branch
    return repo


def schedule_payload(cron: str = "0 3 * * *") -> dict[str, Any]:
    sender = copy.deepcopy(example("pull_request.labeled")["sender"])
    return {"schedule": cron, "repository": repository_object(), "sender": sender,
            "workflow": ".github/workflows/fusebot-nightly.yml"}


def dispatch_payload(ref: str = "refs/heads/main", inputs: dict[str, str] | None = None) -> dict[str, Any]:
    sender = copy.deepcopy(example("pull_request.labeled")["sender"])
    return {"inputs": inputs or {}, "ref": ref, "repository": repository_object(), "sender": sender,
            "workflow": ".github/workflows/fusebot-nightly.yml"}


@dataclass
class ActionWorld:
    fake: ActionGitHub
    repo: GitRepo
    tmp: Path
    shas: dict[str, str]
    jobs: list[Job] = field(default_factory=list)
    environ_seen: dict[str, str] = field(default_factory=dict)
    results: list[JobResult] = field(default_factory=list)

    @property
    def workspace(self) -> Path:
        return self.tmp / "workspace"

    @property
    def summary(self) -> Path:
        return self.tmp / "step_summary.md"

    @property
    def output(self) -> Path:
        return self.tmp / "github_output"

    def checkout(self, sha: str) -> None:
        """actions/checkout with fetch-depth: 0 at `sha` (a fresh clone, as on an ephemeral runner)."""
        subprocess.run(["rm", "-rf", str(self.workspace)], check=True)
        subprocess.run(["git", "clone", "-q", str(self.repo.bare), str(self.workspace)], check=True)
        git(self.workspace, "checkout", "-q", "--detach", sha)

    def event(self, name: str, payload: dict[str, Any]) -> dict[str, str]:
        """Write the payload and return the environment GitHub sets for this trigger."""
        path = self.tmp / f"{name}.event.json"
        path.write_text(json.dumps(payload))
        env = {
            "CI": "true", "GITHUB_ACTIONS": "true", "RUNNER_OS": "Linux", "RUNNER_TEMP": str(self.tmp),
            "GITHUB_EVENT_NAME": name, "GITHUB_EVENT_PATH": str(path), "GITHUB_REPOSITORY": REPO,
            "GITHUB_REPOSITORY_OWNER": REPO.split("/")[0], "GITHUB_WORKSPACE": str(self.workspace),
            "GITHUB_API_URL": self.fake.base_url, "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_GRAPHQL_URL": self.fake.base_url + "/graphql", "GITHUB_RUN_ID": RUN_ID,
            "GITHUB_RUN_NUMBER": "12", "GITHUB_RUN_ATTEMPT": "1", "GITHUB_ACTOR": payload["sender"]["login"],
            "GITHUB_WORKFLOW": "fusebot", "GITHUB_JOB": "fusebot", "GITHUB_ACTION": "__fusebot_fusebot",
            "GITHUB_STEP_SUMMARY": str(self.summary), "GITHUB_OUTPUT": str(self.output),
            "GITHUB_ENV": str(self.tmp / "github_env"), "GITHUB_PATH": str(self.tmp / "github_path"),
        }
        if name in ("pull_request", "pull_request_target"):
            number = payload["number"]
            pull = payload["pull_request"]
            merge = "0123456789abcdef" * 2 + "01234567"  # the test merge commit GitHub makes: never searched
            env.update(GITHUB_REF=f"refs/pull/{number}/merge", GITHUB_REF_NAME=f"{number}/merge",
                       GITHUB_REF_TYPE="branch", GITHUB_SHA=merge if name == "pull_request" else pull["base"]["sha"],
                       GITHUB_HEAD_REF=pull["head"]["ref"], GITHUB_BASE_REF=pull["base"]["ref"])
        else:
            ref = payload.get("ref", "refs/heads/main")
            env.update(GITHUB_REF=ref, GITHUB_REF_NAME=ref.removeprefix("refs/heads/"), GITHUB_REF_TYPE="branch",
                       GITHUB_SHA=self.shas["main"], GITHUB_HEAD_REF="", GITHUB_BASE_REF="")
        return env

    def labeled(self, label: str = LABEL, fork: bool = False) -> dict[str, Any]:
        return pr_payload("labeled", number=2, head_sha=self.shas["feature"], base_sha=self.shas["main"],
                          label=label, fork=fork)

    def outputs(self) -> dict[str, str]:
        """GITHUB_OUTPUT parsed as the runner parses it (`name<<DELIMITER` blocks, or `name=value`)."""
        out: dict[str, str] = {}
        lines = self.output.read_text().split("\n") if self.output.exists() else []
        i = 0
        while i < len(lines):
            line = lines[i]
            if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
                name, delimiter = line.split("<<", 1)
                end = lines.index(delimiter, i + 1)
                out[name] = "\n".join(lines[i + 1:end])
                i = end + 1
            elif "=" in line:
                name, value = line.split("=", 1)
                out[name] = value
                i += 1
            else:
                i += 1
        return out


def make_action_world(tmp: Path, fake: ActionGitHub) -> ActionWorld:
    repo = GitRepo.create(fake.git_root, REPO)
    main = repo.commit(initial_files(), "initial")
    attn = initial_files()["models/attn.py"] + "\n# faster soon\n"
    feature = repo.commit({"models/attn.py": attn}, "touch attn", branch="feature")
    fake.add_repo(REPO, INSTALLATION, repo.bare)
    fake.grant_token(TOKEN, INSTALLATION)
    return ActionWorld(fake, repo, tmp, {"main": main, "feature": feature})


def fake_result(job: Job, improved: TargetResult, slow: TargetResult) -> JobResult:
    """The job's first target as the improved result (real verdict and files), the others not improved."""
    out = []
    for i, t in enumerate(job.targets):
        r = improved if i == 0 else slow
        out.append(r.model_copy(update={"target": t.name, "file": t.file, "class_name": t.class_name}))
    return JobResult(job_id=job.id, ok=True, targets=out, environment=improved.verdict.environment)
