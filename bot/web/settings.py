"""The bot's settings: read once from the environment at start-up, validated, then passed down explicitly.

Nothing else in bot/ reads os.environ. Secrets are `SecretStr` so they never appear in a repr or a log line, and a
placeholder or missing secret refuses to start (the full-stack-fastapi-template rule).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Values people paste from examples and forget to change.
PLACEHOLDERS = {"", "changeme", "change-me", "changethis", "secret", "placeholder", "xxx", "todo", "example", "test"}
MIN_SECRET_CHARS = 16


def is_placeholder(value: str) -> bool:
    v = value.strip().lower()
    return v in PLACEHOLDERS or (v.startswith("<") and v.endswith(">")) or set(v) <= {"x", "*", "-", "."}


def check_secret(name: str, value: str) -> None:
    if is_placeholder(value):
        raise ValueError(f"{name} is a placeholder: set a real secret")
    if len(value) < MIN_SECRET_CHARS:
        raise ValueError(f"{name} is shorter than {MIN_SECRET_CHARS} characters")


class Settings(BaseSettings):
    """Environment variables are FUSEBOT_<FIELD> (DATABASE_URL is also accepted for the database)."""

    # populate_by_name: Settings(database_url=...) is taken as given; pydantic-settings before 2.15 otherwise matched
    # an aliased field's keyword only by its aliases and silently kept the default database (measured with 2.14.2)
    model_config = SettingsConfigDict(env_prefix="FUSEBOT_", extra="ignore", hide_input_in_errors=True,
                                      populate_by_name=True)

    app_id: int = Field(gt=0)
    private_key: SecretStr | None = None  # the App's PEM private key, or:
    private_key_path: Path | None = None
    webhook_secret: SecretStr
    runner_tokens: dict[str, SecretStr]  # runner name -> bearer token, as JSON in the environment
    database_url: str = Field(
        default="sqlite:///fusebot.db", validation_alias=AliasChoices("FUSEBOT_DATABASE_URL", "DATABASE_URL")
    )
    data_dir: Path = Path("fusebot-data")  # job source tarballs and scratch clones
    github_api_url: str = "https://api.github.com"
    # Where to clone from; {token} is an installation token, {repo} is owner/name.
    git_url_template: str = "https://x-access-token:{token}@github.com/{repo}.git"
    github_request_interval_seconds: Annotated[float, Field(ge=0)] = 0.25  # PyGithub's pacing of all requests
    github_write_interval_seconds: Annotated[float, Field(ge=0)] = 1.0  # and of writes (secondary rate limits)
    trigger_label: str = "optimize-kernels"
    check_run_name: str = "fusebot"
    # a unit's lease lasts this long past its worker's last heartbeat (workers beat every few seconds): a worker that
    # stops answering (killed, its machine gone) has its unit queued again for another within about this long
    lease_ttl_seconds: Annotated[float, Field(gt=0)] = 60.0
    max_attempts: Annotated[int, Field(ge=1)] = 3  # leases of one unit: the last one's worker lost, the unit fails
    # units (targets) one repository may have leased at once, over every runner: a busy repository leaves GPUs to the
    # others (repositories also take turns: bot/store/units.py)
    max_units_per_repo: Annotated[int, Field(ge=1, le=10_000)] = 8
    delivery_claim_seconds: Annotated[float, Field(gt=0)] = 60.0  # a crashed handler's delivery is retried after this
    scheduler_interval_seconds: Annotated[float, Field(gt=0)] = 60.0
    worker_poll_seconds: Annotated[float, Field(gt=0)] = 1.0
    data_retention_hours: Annotated[float, Field(gt=0)] = 24.0  # clones and finished jobs' source tarballs
    delivery_retention_days: Annotated[float, Field(gt=0)] = 30.0  # stored webhook payloads (ids are kept)
    log_level: str = "INFO"

    @field_validator("webhook_secret")
    @classmethod
    def _webhook_secret(cls, v: SecretStr) -> SecretStr:
        check_secret("webhook_secret", v.get_secret_value())
        return v

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, v: str) -> str:
        if not v.startswith(("sqlite:///", "postgresql://", "postgresql+psycopg://")):
            raise ValueError("database_url must be sqlite:///PATH or postgresql://USER@HOST/DB")
        return v

    @field_validator("runner_tokens")
    @classmethod
    def _runner_tokens(cls, v: dict[str, SecretStr]) -> dict[str, SecretStr]:
        if not v:
            raise ValueError("runner_tokens is empty: give each runner a token")
        seen: set[str] = set()
        for name, token in v.items():
            check_secret(f"runner token {name!r}", token.get_secret_value())
            if token.get_secret_value() in seen:
                raise ValueError(f"runner token {name!r} is shared with another runner")
            seen.add(token.get_secret_value())
        return v

    @model_validator(mode="after")
    def _private_key(self) -> Settings:
        if self.private_key is None and self.private_key_path is not None:
            try:
                self.private_key = SecretStr(self.private_key_path.read_text())
            except OSError as e:
                raise ValueError(f"private_key_path cannot be read: {e.strerror}") from None
        if self.private_key is None:
            raise ValueError("set private_key or private_key_path (the GitHub App's PEM key)")
        pem = self.private_key.get_secret_value()
        if is_placeholder(pem):
            raise ValueError("private_key is a placeholder")
        try:
            key = load_pem_private_key(pem.encode(), password=None)
        except (ValueError, TypeError):
            raise ValueError("private_key is not a PEM private key") from None
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ValueError("private_key must be an RSA key (GitHub Apps sign with RS256)")
        return self

    def secrets(self) -> list[str]:
        """Every secret value, for log redaction and for the tests that check none is logged."""
        out = [self.webhook_secret.get_secret_value()]
        out += [t.get_secret_value() for t in self.runner_tokens.values()]
        if self.private_key is not None:
            out.append(self.private_key.get_secret_value())
        return out


def load_settings(**overrides: object) -> Settings:
    """Read the environment (plus overrides). Raises SettingsError with a message that names no secret value."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as e:
        lines = [f"  {'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}" for err in e.errors()]
        raise SettingsError("invalid fusebot settings:\n" + "\n".join(lines)) from None


class SettingsError(Exception):
    """Settings are missing or unsafe; the message is safe to print."""
