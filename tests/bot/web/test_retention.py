"""Retention: old clones, unneeded source tarballs and handled payloads go; what an active job needs stays."""

from __future__ import annotations

import copy
import os
import time
from datetime import timedelta
from pathlib import Path

from bot.store.db import utcnow
from bot.web import retention
from tests.bot.helpers import INSTALLATION, REPO, example, pr_payload


def age(path: Path, hours: float) -> None:
    t = time.time() - hours * 3600
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(p, (t, t), follow_symlinks=False)


def test_retention_removes_what_no_active_job_needs(world):
    main, feature = world.shas["main"], world.shas["feature"]
    world.post("pull_request", pr_payload("labeled", number=2, head_sha=feature, base_sha=main,
                                          label="optimize-kernels"), delivery="old")
    world.drain()
    [old_job] = world.jobs()
    world.ctx.store.cancel(REPO, pr_number=2)
    sources = sorted(world.ctx.sources_dir.glob("*/*.tar.gz"))
    clones = sorted(world.ctx.clones_dir.glob("*/*"))
    assert len(sources) == 1 and clones
    for p in sources + clones:
        age(p, 48)

    removed = retention.collect(world.ctx, utcnow() + timedelta(days=31))
    assert removed["clones"] == len(clones) and removed["sources"] == 1 and removed["payloads"] == 1
    assert not Path(old_job.source_path).exists()
    # the replay guard survives the payload
    again = world.post("pull_request", pr_payload("labeled", number=2, head_sha=feature, base_sha=main,
                                                  label="optimize-kernels"), delivery="old")
    assert again.json()["duplicate"] is True

    # re-running the finished job rebuilds its source from the pinned commit
    ev = copy.deepcopy(example("check_run.rerequested"))
    ev["check_run"]["id"], ev["repository"]["full_name"] = old_job.check_run_id, REPO
    ev["installation"]["id"], ev["sender"]["login"] = INSTALLATION, "maintainer"
    world.post("check_run", ev)
    world.drain()
    [rerun] = [j for j in world.jobs() if j.id != old_job.id]
    assert rerun.sha == feature and Path(rerun.source_path).is_file()


def test_source_of_an_active_job_is_kept(world):
    world.post("pull_request", pr_payload("labeled", number=2, head_sha=world.shas["feature"],
                                          base_sha=world.shas["main"], label="optimize-kernels"))
    world.drain()
    [job] = world.jobs()
    age(Path(job.source_path), 48)
    assert retention.collect(world.ctx, utcnow())["sources"] == 0
    assert Path(job.source_path).is_file()
