"""The Action's settings and its trigger: what GitHub sets in the environment, read and validated once at start-up.

GitHub Actions sets `GITHUB_*` for every step (docs.github.com, "Store information in variables": default
environment variables); action.yml passes the Action's inputs as `FUSEBOT_*` variables of the one step that runs
`fusebot action` (never interpolated into the script, so an input cannot inject shell). The token is a `SecretStr`:
it never appears in a repr, a log line, an output or the job summary.

`trigger_of(settings, event)` is pure: the event's payload in, what to run (or why nothing runs) out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from bot.repo.config import CONFIG_PATH

EVENTS = ("pull_request", "pull_request_target", "schedule", "workflow_dispatch")


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class ActionSettings(BaseSettings):
    """GitHub's variables (GITHUB_*) and the Action's inputs (FUSEBOT_*, set by action.yml from `inputs.*`)."""

    model_config = SettingsConfigDict(extra="ignore", hide_input_in_errors=True, populate_by_name=True)

    event_name: str = Field(validation_alias=_env("GITHUB_EVENT_NAME"))
    event_path: Path = Field(validation_alias=_env("GITHUB_EVENT_PATH"))
    repository: str = Field(pattern=r"^[\w.-]+/[\w.-]+$", validation_alias=_env("GITHUB_REPOSITORY"))
    sha: str = Field(pattern=r"^[0-9a-f]{40}$", validation_alias=_env("GITHUB_SHA"))
    ref_name: str | None = Field(default=None, validation_alias=_env("GITHUB_REF_NAME"))
    ref_type: str | None = Field(default=None, validation_alias=_env("GITHUB_REF_TYPE"))
    workspace: Path = Field(validation_alias=_env("GITHUB_WORKSPACE"))
    api_url: str = Field(default="https://api.github.com", validation_alias=_env("GITHUB_API_URL"))
    server_url: str = Field(default="https://github.com", validation_alias=_env("GITHUB_SERVER_URL"))
    run_id: str = Field(default="0", validation_alias=_env("GITHUB_RUN_ID"))
    run_attempt: str = Field(default="1", validation_alias=_env("GITHUB_RUN_ATTEMPT"))
    step_summary: Path | None = Field(default=None, validation_alias=_env("GITHUB_STEP_SUMMARY"))
    output: Path | None = Field(default=None, validation_alias=_env("GITHUB_OUTPUT"))

    token: SecretStr = Field(validation_alias=_env("FUSEBOT_GITHUB_TOKEN", "GITHUB_TOKEN"))
    label: str = Field(default="", max_length=50, validation_alias=_env("FUSEBOT_LABEL"))
    config_path: str = Field(default=CONFIG_PATH, validation_alias=_env("FUSEBOT_CONFIG_PATH"))
    budget_seconds: float | None = Field(default=None, gt=0, validation_alias=_env("FUSEBOT_BUDGET_SECONDS"))
    models: str = Field(default="", validation_alias=_env("FUSEBOT_MODELS"))
    # the `gpus` input: read again by the runner (runner.pipeline.job_devices), which checks the indices are visible
    gpus: str = Field(default="", validation_alias=_env("FUSEBOT_GPUS"))
    log_level: str = Field(default="INFO", validation_alias=_env("FUSEBOT_LOG_LEVEL"))
    # PyGithub's pacing of requests and of writes (GitHub's secondary rate limits); the App's defaults
    request_interval_seconds: float = Field(default=0.25, ge=0,
                                            validation_alias=_env("FUSEBOT_GITHUB_REQUEST_INTERVAL_SECONDS"))
    write_interval_seconds: float = Field(default=1.0, ge=0,
                                          validation_alias=_env("FUSEBOT_GITHUB_WRITE_INTERVAL_SECONDS"))

    @field_validator("token")
    @classmethod
    def _token(cls, v: SecretStr) -> SecretStr:
        if not v.get_secret_value().strip():
            raise ValueError("the GitHub token is empty: pass `github-token` (default: ${{ github.token }})")
        return v

    @field_validator("event_name")
    @classmethod
    def _event(cls, v: str) -> str:
        if v not in EVENTS:
            raise ValueError(f"fusebot's Action runs on {', '.join(EVENTS)}, not on {v!r}")
        return v

    @field_validator("config_path")
    @classmethod
    def _config_path(cls, v: str) -> str:
        if v.startswith("/") or ".." in v.split("/"):
            raise ValueError("config-path must be relative to the repository root")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: str) -> str:
        if v.strip().lower() not in ("", "all") and not re.fullmatch(r"\s*\d+\s*(,\s*\d+\s*)*", v):
            raise ValueError(f"gpus takes device indices like 0,1 (or all), not {v!r}")
        return v

    @field_validator("budget_seconds", mode="before")
    @classmethod
    def _empty_budget(cls, v: Any) -> Any:
        return None if isinstance(v, str) and not v.strip() else v

    @property
    def model_list(self) -> list[str]:
        return [m.strip() for m in self.models.replace("\n", ",").split(",") if m.strip()]

    def load_event(self) -> dict[str, Any]:
        return json.loads(self.event_path.read_text())


@dataclass(frozen=True)
class Trigger:
    """What one run of the Action does."""

    kind: Literal["label", "schedule", "dispatch"]
    base: str  # the branch a fusebot PR goes into (the labelled PR's head branch, or the default branch)
    base_sha: str  # the commit searched, and the PR's parent
    pr_number: int | None = None
    fork: bool = False
    pr_base_sha: str | None = None  # the labelled PR's base commit: its changed files are the targets


@dataclass(frozen=True)
class Skip:
    reason: str


def trigger_of(settings: ActionSettings, event: dict[str, Any], label: str) -> Trigger | Skip:
    """The run's trigger from the event payload; `Skip` with why when this event asks for nothing."""
    name = settings.event_name
    if name in ("pull_request", "pull_request_target"):
        if event.get("action") != "labeled":
            return Skip(f"{name} `{event.get('action')}`: fusebot runs only when a PR is labelled `{label}`")
        added = (event.get("label") or {}).get("name")
        if added != label:
            return Skip(f"label `{added}` added; fusebot runs on `{label}` only")
        pull = event["pull_request"]
        head, base_repo = pull["head"], (pull.get("base") or {}).get("repo") or event.get("repository") or {}
        head_repo = (head.get("repo") or {}).get("full_name")  # None: the fork was deleted
        fork = head_repo != base_repo.get("full_name", settings.repository)
        return Trigger("label", head["ref"], head["sha"], int(pull["number"]), fork, pull.get("base", {}).get("sha"))
    default = (event.get("repository") or {}).get("default_branch") or settings.ref_name or "main"
    if name == "schedule":  # GitHub runs a schedule on the default branch's latest commit
        return Trigger("schedule", default, settings.sha)
    # workflow_dispatch: the branch it was dispatched on (the default branch unless someone picked another)
    branch = settings.ref_name if settings.ref_type in (None, "branch") and settings.ref_name else default
    return Trigger("dispatch", branch, settings.sha)
