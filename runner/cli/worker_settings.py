"""`fusebot worker`'s settings (FUSEBOT_WORKER_*), validated at start-up."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "FUSEBOT_WORKER_"
FLAGS = {"bot_url": "--bot", "gpu_index": "--gpu"}  # settings the command line may give instead
_PLACEHOLDERS = {"", "changeme", "change-me", "secret", "placeholder", "token", "xxx", "test"}


class WorkerSettings(BaseSettings):
    """FUSEBOT_WORKER_<FIELD>; `bot_url` and `gpu_index` may come from the command line."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", hide_input_in_errors=True)

    bot_url: str
    token: SecretStr
    name: str = Field(default_factory=lambda: os.uname().nodename)
    gpu_index: int | None = Field(default=None, ge=0)
    poll_seconds: Annotated[float, Field(gt=0)] = 5.0
    heartbeat_seconds: Annotated[float, Field(gt=0)] = 2.0  # also how soon a cancel is heard: stop within 5 s
    upload_retry_seconds: Annotated[float, Field(gt=0)] = 300.0  # keep trying to hand in a result this long
    work_dir: Path | None = None  # default: a temporary directory per job
    alive_file: Path | None = None  # touched on every poll and every heartbeat: the container's health check reads it
    ready_file: Path | None = None  # present while the bot answers and the worker takes work: a readiness probe
    lease_file: Path | None = None  # the unit held, noted so that a restart after a kill hands it back at once
    drain_seconds: Annotated[float, Field(ge=0)] = 0.0  # SIGTERM: the running unit may finish this long, then goes back

    @field_validator("token")
    @classmethod
    def _token(cls, v: SecretStr) -> SecretStr:
        t = v.get_secret_value().strip()
        if t.lower() in _PLACEHOLDERS or (t.startswith("<") and t.endswith(">")) or len(t) < 16:
            raise ValueError("the runner token is missing, a placeholder or shorter than 16 characters")
        return v

    @field_validator("bot_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return v.rstrip("/")


def settings_problems(e: ValidationError, given: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """One line per problem, naming where the setting comes from: its flag where it was `given` on the command
    line, else its environment variable (FUSEBOT_WORKER_BOT_URL is not set); never its value."""
    out = []
    for err in e.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        where = FLAGS[field] if field in given else f"{ENV_PREFIX}{field.upper()}" if field else "settings"
        if err["type"] == "missing":
            flag = f" (or pass {FLAGS[field]})" if field in FLAGS else ""
            out.append(f"{where} is not set{flag}")
        else:
            out.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
    return out
