"""The App's flow driven from a test: a labelled PR's webhook, a runner leasing the job and uploading real results,
the outbox delivering them; and what the fake GitHub then holds."""

from __future__ import annotations

import subprocess

from bot.publish.notify import sync_check_runs
from runner.contract import TargetResult
from runner.results.files import Provenance, slug, target_files
from tests.bot.helpers import REPO, comment_payload, pr_payload
from tests.fakes.github_server import Pull
from tests.verdicts import SPEC, real_verdicts, seed_candidate

LEASE = "X-Fusebot-Lease"


def results_for(job: dict, improved: bool) -> list[dict]:
    v = real_verdicts()["fused" if improved else "slow"]
    out = []
    for t in job["targets"]:
        files = {}
        if improved:
            made = target_files(SPEC, seed_candidate(), v, Provenance.for_verdict(t["name"], v, REPO, job["sha"]))
            files = {path.replace(slug(SPEC.name), slug(t["name"]), 1): text for path, text in made.items()}
        out.append(TargetResult(target=t["name"], improved=improved, verdict=v, files=files, file=t["file"],
                                class_name=t["class_name"], trace_markdown="### Round 1\nseed: verified",
                                message="" if improved else "nothing beat eager").model_dump(mode="json"))
    return out


def label_and_run(world, *, number: int, sha: str, improved: bool = True, fork: bool = False,
                  head_ref: str = "feature") -> dict:
    """A labelled-PR webhook, a runner leasing the job and uploading results, the outbox delivering them."""
    world.post("pull_request", pr_payload("labeled", number=number, head_sha=sha, base_sha=world.shas["main"],
                                          label="optimize-kernels", fork=fork, head_ref=head_ref))
    world.drain()
    sync_check_runs(world.ctx)  # the check run: queued
    leased = world.client.post("/runner/v1/lease", headers=world.runner("gpu-a")).json()
    job = leased["job"]
    body = {"job_id": job["id"], "ok": True, "targets": results_for(job, improved),
            "environment": real_verdicts()["fused"].environment.model_dump(mode="json")}
    hdr = {**world.runner("gpu-a"), LEASE: leased["lease_token"]}
    assert world.client.post(f"/runner/v1/jobs/{job['id']}/result", json=body, headers=hdr).json() == {"recorded": True}
    sync_check_runs(world.ctx)  # completed: PRs, check run, status comment
    return job


def bot_pulls(world) -> list[Pull]:
    return [p for p in world.fake.pulls.values() if p.user == "fusebot[bot]"]


def branch_files(world, branch: str) -> dict[str, str]:
    names = subprocess.run(["git", "--git-dir", str(world.repo.bare), "ls-tree", "-r", "--name-only", branch],
                           check=True, capture_output=True, text=True).stdout.split()
    return {n: subprocess.run(["git", "--git-dir", str(world.repo.bare), "show", f"{branch}:{n}"], check=True,
                              capture_output=True, text=True).stdout for n in names}


def command(world, text: str, number: int, comment_id: int) -> None:
    world.fake.add_comment(REPO, number, comment_id, text, "maintainer")
    world.post("issue_comment", comment_payload(text, number=number, comment_id=comment_id))
    world.drain()
