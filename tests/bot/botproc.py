"""`fusebot serve` as a real process (python -m bot.cli serve), for tests that kill and restart it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.bot.helpers import APP_ID, RUNNER_TOKENS, WEBHOOK_SECRET, rsa_keys
from tests.fakes.serve import free_port

ROOT = Path(__file__).resolve().parents[2]


class BotProcess:
    def __init__(self, tmp: Path, github_url: str, git_template: str, **extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / "bot.log"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "FUSEBOT_APP_ID": str(APP_ID),
            "FUSEBOT_PRIVATE_KEY": rsa_keys()[0],
            "FUSEBOT_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "FUSEBOT_RUNNER_TOKENS": json.dumps(RUNNER_TOKENS),
            "DATABASE_URL": f"sqlite:///{tmp / 'bot.db'}",
            "FUSEBOT_DATA_DIR": str(tmp / "data"),
            "FUSEBOT_GITHUB_API_URL": github_url,
            "FUSEBOT_GIT_URL_TEMPLATE": git_template,
            "FUSEBOT_GITHUB_REQUEST_INTERVAL_SECONDS": "0",
            "FUSEBOT_GITHUB_WRITE_INTERVAL_SECONDS": "0",
            "FUSEBOT_LOG_LEVEL": "DEBUG",
            **extra,
        }
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30) -> None:
        log = self.log_path.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"bot exited {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("bot did not become healthy")

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no flushing, as a crash or an OOM kill."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""
