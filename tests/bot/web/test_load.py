"""Load: a burst of 600 signed deliveries against `fusebot serve` on loopback, 16 and then 64 at a time.

Every delivery must be answered 2xx well inside GitHub's 10 seconds, replays must be recognised, and once the
background loop has caught up every label delivery must have become exactly one job. The measured latencies are
printed and written to $FUSEBOT_LOAD_REPORT when set. The client runs in its own process (tests/bot/load_client.py).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import random
import statistics
import subprocess
import sys
import time

import httpx
import pytest

from bot.store.db import init_db
from bot.store.store import Store
from tests.bot.botproc import ROOT, BotProcess
from tests.bot.helpers import INSTALLATION, REPO, GitRepo, example, initial_files, pr_payload
from tests.fakes.github_server import FakeGitHub, Pull

LABELLED_PRS = 120
REPLAYS = 80
CLOSED = 150
PINGS = 250


@pytest.mark.parametrize("concurrency", [16, 64])
def test_burst_of_signed_deliveries(tmp_path, fake_github: FakeGitHub, concurrency: int):
    repo = GitRepo.create(fake_github.git_root, REPO)
    main = repo.commit(initial_files(), "initial")
    feature = repo.commit({"models/attn.py": initial_files()["models/attn.py"] + "\n# x\n"}, "f", branch="feature")
    fake_github.add_repo(REPO, INSTALLATION, repo.bare)
    fake_github.set_permission(REPO, "maintainer", "write")
    deliveries: list[tuple[str, str, bytes]] = []
    for n in range(100, 100 + LABELLED_PRS):
        fake_github.add_pull(Pull(REPO, n, feature, "feature", REPO, "main", main))
        p = pr_payload("labeled", number=n, head_sha=feature, base_sha=main, label="optimize-kernels")
        deliveries.append(("pull_request", f"label-{n}", json.dumps(p).encode()))
    deliveries += random.Random(1).sample(deliveries, REPLAYS)  # GitHub redelivering
    for n in range(1000, 1000 + CLOSED):
        p = pr_payload("closed", number=n, head_sha=feature, base_sha=main, state="closed")
        deliveries.append(("pull_request", f"closed-{n}", json.dumps(p).encode()))
    ping = json.dumps(example("ping.with-app_id")).encode()
    deliveries += [("ping", f"ping-{i}", copy.copy(ping)) for i in range(PINGS)]
    random.Random(2).shuffle(deliveries)
    assert len(deliveries) >= 500

    bot = BotProcess(tmp_path, fake_github.base_url, fake_github.clone_url_template(), FUSEBOT_LOG_LEVEL="INFO")
    bot.start()
    try:
        src, out = tmp_path / "deliveries.json", tmp_path / "latencies.json"
        src.write_text(json.dumps([[e, d, base64.b64encode(b).decode()] for e, d, b in deliveries]))
        subprocess.run([sys.executable, "-m", "tests.bot.load_client", bot.url, str(src), str(out), str(concurrency)],
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, timeout=300)
        measured = json.loads(out.read_text())
        latencies_s, statuses = measured["latencies_s"], measured["statuses"]
        assert all(200 <= s < 300 for s in statuses), sorted(set(statuses))
        assert statuses.count(202) == LABELLED_PRS + CLOSED  # each new delivery queued once, replays answered 200
        p50, p99, worst = statistics.median(latencies_s), statistics.quantiles(latencies_s, n=100)[98], max(latencies_s)
        report = {"deliveries": len(deliveries), "concurrency": concurrency, "p50_ms": p50 * 1000,
                  "p99_ms": p99 * 1000, "max_ms": worst * 1000}
        print("LOAD", json.dumps(report))
        print("\n".join(ln for ln in httpx.get(f"{bot.url}/metrics").text.splitlines() if "webhook_response" in ln))
        if os.environ.get("FUSEBOT_LOAD_REPORT"):
            with open(os.environ["FUSEBOT_LOAD_REPORT"], "a") as f:
                f.write(json.dumps(report) + "\n")
        assert worst < 10.0

        store = Store(init_db(bot.env["DATABASE_URL"]))
        deadline = time.monotonic() + 120
        while store.delivery_counts().get("done", 0) < LABELLED_PRS + CLOSED and time.monotonic() < deadline:
            time.sleep(0.2)
        assert store.delivery_counts() == {"done": LABELLED_PRS + CLOSED}
        jobs = store.list_jobs()
        assert len(jobs) == LABELLED_PRS
        assert sorted(j.pr_number for j in jobs) == list(range(100, 100 + LABELLED_PRS))  # each exactly once
    finally:
        bot.stop()
