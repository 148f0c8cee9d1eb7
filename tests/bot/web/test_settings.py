"""Settings refuse to start on missing or placeholder secrets, and their errors never echo a secret."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bot.web.settings import Settings, SettingsError, load_settings
from tests.bot.helpers import APP_ID, RUNNER_TOKENS, WEBHOOK_SECRET, rsa_keys


def good(**over):
    values = {
        "app_id": APP_ID,
        "private_key": rsa_keys()[0],
        "webhook_secret": WEBHOOK_SECRET,
        "runner_tokens": RUNNER_TOKENS,
    }
    values.update(over)
    return values


def test_valid_settings_load(monkeypatch):
    monkeypatch.setenv("FUSEBOT_MAX_UNITS_PER_REPO", "3")
    s = Settings(**good())
    assert s.database_url.startswith("sqlite:///") and s.max_units_per_repo == 3
    assert WEBHOOK_SECRET not in repr(s) and rsa_keys()[0] not in repr(s)


def test_a_database_url_given_by_name_is_the_one_used(monkeypatch, tmp_path):
    """The field has environment aliases (FUSEBOT_DATABASE_URL, DATABASE_URL); a keyword by its name must still win
    over the default (pydantic-settings 2.14 dropped it, and every test world shared ./fusebot.db)."""
    for name in ("FUSEBOT_DATABASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    url = f"sqlite:///{tmp_path / 'mine.db'}"
    assert Settings(**good(database_url=url)).database_url == url
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'env.db'}")
    assert Settings(**good()).database_url == f"sqlite:///{tmp_path / 'env.db'}"


@pytest.mark.parametrize(
    "over, message",
    [
        ({"webhook_secret": "changeme"}, "placeholder"),
        ({"webhook_secret": "short-secret"}, "shorter than"),
        ({"webhook_secret": "<your-webhook-secret>"}, "placeholder"),
        ({"runner_tokens": {}}, "empty"),
        ({"runner_tokens": {"a": "xxxxxxxxxxxxxxxxxxxx"}}, "placeholder"),
        ({"runner_tokens": {"a": "same-token-0123456789", "b": "same-token-0123456789"}}, "shared"),
        ({"private_key": "-----BEGIN RSA PRIVATE KEY-----\nnot a key\n-----END RSA PRIVATE KEY-----"}, "not a PEM"),
        ({"private_key": None}, "private_key"),
        ({"app_id": 0}, "app_id"),
        ({"database_url": "mysql://db/fusebot"}, "database_url"),
        ({"max_units_per_repo": 0}, "max_units_per_repo"),
    ],
)
def test_unsafe_settings_refused(over, message):
    with pytest.raises(SettingsError) as e:
        load_settings(**good(**over))
    assert message in str(e.value)
    for secret in (WEBHOOK_SECRET, *RUNNER_TOKENS.values(), "same-token-0123456789", "short-secret"):
        assert secret not in str(e.value)


def test_missing_secrets_refused(monkeypatch):
    for var in ("FUSEBOT_WEBHOOK_SECRET", "FUSEBOT_RUNNER_TOKENS", "FUSEBOT_PRIVATE_KEY", "FUSEBOT_APP_ID"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SettingsError) as e:
        load_settings()
    assert "webhook_secret" in str(e.value) and "runner_tokens" in str(e.value)


def test_environment_and_key_file(monkeypatch, tmp_path):
    key = tmp_path / "app.pem"
    key.write_text(rsa_keys()[0])
    monkeypatch.setenv("FUSEBOT_APP_ID", str(APP_ID))
    monkeypatch.setenv("FUSEBOT_PRIVATE_KEY_PATH", str(key))
    monkeypatch.setenv("FUSEBOT_WEBHOOK_SECRET", WEBHOOK_SECRET)
    monkeypatch.setenv("FUSEBOT_RUNNER_TOKENS", '{"gpu-a": "runner-a-token-0123456789"}')
    monkeypatch.setenv("DATABASE_URL", "postgresql://fusebot@db/fusebot")
    s = load_settings()
    assert s.private_key is not None and s.private_key.get_secret_value() == rsa_keys()[0]
    assert s.database_url == "postgresql://fusebot@db/fusebot"
    assert set(s.runner_tokens) == {"gpu-a"}


def test_serve_refuses_to_start_without_secrets(monkeypatch, caplog):
    from bot.web.server import app

    monkeypatch.setenv("FUSEBOT_APP_ID", str(APP_ID))
    monkeypatch.setenv("FUSEBOT_PRIVATE_KEY", rsa_keys()[0])
    monkeypatch.setenv("FUSEBOT_WEBHOOK_SECRET", "changeme")
    monkeypatch.delenv("FUSEBOT_RUNNER_TOKENS", raising=False)
    result = CliRunner().invoke(app, ["--port", "1"])
    assert result.exit_code == 2
    assert "webhook_secret" in caplog.text and "placeholder" in caplog.text
    assert rsa_keys()[0].splitlines()[1] not in caplog.text
