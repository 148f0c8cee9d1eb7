from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bot.context import Context
from bot.web.server import build_context, create_app
from bot.web.settings import Settings
from tests.bot.helpers import (
    APP_ID,
    INSTALLATION,
    REPO,
    RUNNER_TOKENS,
    WEBHOOK_SECRET,
    GitRepo,
    check_payload,
    initial_files,
    rsa_keys,
    signed_headers,
)
from tests.fakes.github_server import FakeGitHub, Pull


@pytest.fixture
def fake_github(tmp_path: Path) -> Iterator[FakeGitHub]:
    fake = FakeGitHub(APP_ID, rsa_keys()[1], tmp_path / "git")
    with fake.running():
        yield fake
    assert fake.errors == [], "the fake GitHub saw requests or gave responses outside GitHub's OpenAPI description"


def make_settings(tmp_path: Path, fake: FakeGitHub, **over: Any) -> Settings:
    values: dict[str, Any] = {
        "app_id": APP_ID,
        "private_key": rsa_keys()[0],
        "webhook_secret": WEBHOOK_SECRET,
        "runner_tokens": RUNNER_TOKENS,
        "database_url": f"sqlite:///{tmp_path / 'bot.db'}",
        "data_dir": tmp_path / "data",
        "github_api_url": fake.base_url,
        "git_url_template": fake.clone_url_template(),
        "github_request_interval_seconds": 0,
        "github_write_interval_seconds": 0,
        "lease_ttl_seconds": 30,
    }
    values.update(over)
    return Settings(**values)


@dataclass
class World:
    fake: FakeGitHub
    repo: GitRepo
    settings: Settings
    ctx: Context
    client: TestClient
    shas: dict[str, str] = field(default_factory=dict)

    def post(self, event: str, payload: dict[str, Any], delivery: str | None = None, **kw: Any):
        check_payload(event, payload)
        body = json.dumps(payload).encode()
        return self.client.post("/webhook", content=body, headers=signed_headers(event, body, delivery, **kw))

    def drain(self) -> int:
        return self.client.app.state.background.drain()

    def jobs(self):
        return self.ctx.store.list_jobs()

    def runner(self, name: str = "gpu-a") -> dict[str, str]:
        return {"Authorization": f"Bearer {RUNNER_TOKENS[name]}"}


def make_world(tmp_path: Path, fake: FakeGitHub, **settings_over: Any) -> World:
    repo = GitRepo.create(fake.git_root, REPO)
    main = repo.commit(initial_files(), "initial")
    feature = repo.commit(
        {"models/attn.py": initial_files()["models/attn.py"] + "\n# faster soon\n"}, "touch attn", branch="feature"
    )
    fake.add_repo(REPO, INSTALLATION, repo.bare)
    fake.add_pull(Pull(REPO, 2, feature, "feature", REPO, "main", main))
    fake.set_permission(REPO, "maintainer", "write")
    fake.set_permission(REPO, "reader", "read")
    settings = make_settings(tmp_path, fake, **settings_over)
    ctx = build_context(settings)
    ctx.store.upsert_repo(REPO, INSTALLATION)
    app = create_app(settings, ctx=ctx, background=False)
    return World(fake, repo, settings, ctx, TestClient(app), {"main": main, "feature": feature})


@pytest.fixture
def world(tmp_path: Path, fake_github: FakeGitHub) -> Iterator[World]:
    w = make_world(tmp_path, fake_github)
    with w.client:
        yield w


@pytest.fixture
def secret_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


# ---- PostgreSQL: a real server from Debian's packages, started once per session --------------------------------


def _pg_bin() -> Path | None:
    import glob
    import shutil

    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(versions[-1]).parent if versions else None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """Base URL of a throwaway PostgreSQL server (trust auth, loopback only, fsync off)."""
    import os
    import shutil
    import subprocess
    import tempfile

    from tests.fakes.serve import free_port

    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL's initdb was not found (install it with .ci/postgres.sh)")
    root = Path(tempfile.mkdtemp(prefix="fusebot-pg-"))
    os.chmod(root, 0o777)  # postgres refuses to run as root: it runs as nobody, who must write here
    as_user = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
    data, port = root / "data", free_port()
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "fusebot", "--no-sync"],
                   check=True, capture_output=True)
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-w", "-t", "60",
                    "-l", str(root / "log"), "start"], check=True, capture_output=True)
    try:
        yield f"postgresql://fusebot@127.0.0.1:{port}"
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def new_postgres_db(server: str) -> str:
    import uuid

    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"{server}/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    return new_postgres_db(request.getfixturevalue("postgres_server"))
