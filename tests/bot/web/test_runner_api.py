"""The runner API's credentials: runner tokens, and per-job lease tokens."""

from __future__ import annotations

import io
import tarfile

import pytest

from tests.bot.conftest import make_world
from tests.bot.helpers import REPO, RUNNER_TOKENS, comment_payload, pr_payload
from tests.fakes.github_server import Pull

LEASE = "X-Fusebot-Lease"


@pytest.fixture
def two_jobs(world):
    for number in (2, 5):
        if number == 5:
            world.fake.add_pull(Pull("Codertocat/Hello-World", 5, world.shas["feature"], "feature",
                                     "Codertocat/Hello-World", "main", world.shas["main"]))
        world.post("pull_request", pr_payload("labeled", number=number, head_sha=world.shas["feature"],
                                              base_sha=world.shas["main"], label="optimize-kernels"))
    world.drain()
    assert len(world.jobs()) == 2
    return world


def lease(world, runner="gpu-a"):
    r = world.client.post("/runner/v1/lease", headers=world.runner(runner))
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("auth", [None, "Bearer wrong-token-0123456789", "Bearer ", RUNNER_TOKENS["gpu-a"],
                                  "Basic " + RUNNER_TOKENS["gpu-a"]])
def test_wrong_runner_token_is_401(two_jobs, auth):
    headers = {"Authorization": auth} if auth is not None else {}
    assert two_jobs.client.post("/runner/v1/lease", headers=headers).status_code == 401
    assert {j.state for j in two_jobs.jobs()} == {"queued"}


def test_empty_queue_is_204(world):
    assert world.client.post("/runner/v1/lease", headers=world.runner()).status_code == 204


def test_source_only_with_that_jobs_lease(two_jobs):
    w = two_jobs
    a, b = lease(w, "gpu-a"), lease(w, "gpu-b")
    url = f"/runner/v1/jobs/{a['job']['id']}/source"
    ok = w.client.get(url, headers={**w.runner("gpu-a"), LEASE: a["lease_token"]})
    assert ok.status_code == 200 and ok.headers["content-type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(ok.content)) as tar:
        assert "models/attn.py" in tar.getnames()
    # another job's credentials, a forged lease, no lease
    assert w.client.get(url, headers={**w.runner("gpu-b"), LEASE: b["lease_token"]}).status_code == 403
    assert w.client.get(url, headers={**w.runner("gpu-a"), LEASE: "forged"}).status_code == 403
    assert w.client.get(url, headers=w.runner("gpu-a")).status_code == 422
    assert w.client.get(url, headers={LEASE: a["lease_token"]}).status_code == 401


def test_result_recorded_once_and_only_by_the_holder(two_jobs):
    w = two_jobs
    a, b = lease(w, "gpu-a"), lease(w, "gpu-b")
    job_id = a["job"]["id"]
    hdr = {**w.runner("gpu-a"), LEASE: a["lease_token"]}
    hb = w.client.post(f"/runner/v1/jobs/{job_id}/heartbeat", json={"round": 2, "built": 4}, headers=hdr)
    assert hb.json() == {"state": "running"}
    result = {"job_id": job_id, "ok": True, "targets": [{"target": "models.attn.Attention", "improved": False}]}
    stolen = {**w.runner("gpu-b"), LEASE: b["lease_token"]}
    assert w.client.post(f"/runner/v1/jobs/{job_id}/result", json=result, headers=stolen).status_code == 409
    wrong_id = {**result, "job_id": b["job"]["id"]}
    assert w.client.post(f"/runner/v1/jobs/{job_id}/result", json=wrong_id, headers=hdr).status_code == 422
    assert w.client.post(f"/runner/v1/jobs/{job_id}/result", json=result, headers=hdr).json() == {"recorded": True}
    assert w.client.post(f"/runner/v1/jobs/{job_id}/result", json=result, headers=hdr).json() == {"recorded": False}
    assert w.ctx.store.get(job_id).state == "succeeded"
    assert w.ctx.store.get(b["job"]["id"]).state == "leased"


def test_fail_and_release(two_jobs):
    w = two_jobs
    a, b = lease(w), lease(w)
    ha = {**w.runner(), LEASE: a["lease_token"]}
    hb = {**w.runner(), LEASE: b["lease_token"]}
    assert w.client.post(f"/runner/v1/jobs/{a['job']['id']}/fail", json={"error": "GPU fell off the bus"},
                         headers=ha).json() == {"recorded": True}
    assert w.client.post(f"/runner/v1/jobs/{b['job']['id']}/release", headers=hb).json() == {"released": True}
    states = {j.id: (j.state, j.error) for j in w.jobs()}
    assert states[a["job"]["id"]] == ("failed", "GPU fell off the bus")
    assert states[b["job"]["id"]] == ("queued", None)
    w.drain()  # the failure reaches the check run
    failed_run = next(r for r in w.fake.check_runs.values() if r["external_id"] == a["job"]["id"])
    assert failed_run["conclusion"] == "failure" and "GPU fell off the bus" in failed_run["output"]["summary"]


def run_all(world) -> None:
    world.fake.add_comment(REPO, 2, 900, "/fusebot run all", "maintainer")
    world.post("issue_comment", comment_payload("/fusebot run all", number=2, comment_id=900))
    world.drain()


def test_each_target_is_leased_with_its_unit_and_the_jobs_source(world):
    run_all(world)
    [job] = world.jobs()
    a, b = lease(world, "gpu-a"), lease(world, "gpu-b")
    assert world.client.post("/runner/v1/lease", headers=world.runner("gpu-a")).status_code == 204
    assert [a["unit"], b["unit"]] == [{"job_id": job.id, "index": i, "target": t.name, "attempts": 1,
                                       "retry_note": None} for i, t in enumerate(job.spec.targets)]
    for x, runner in ((a, "gpu-a"), (b, "gpu-b")):
        unit_id, hdr = x["job"]["id"], {**world.runner(runner), LEASE: x["lease_token"]}
        assert [t["name"] for t in x["job"]["targets"]] == [x["unit"]["target"]]
        assert world.client.get(f"/runner/v1/jobs/{unit_id}/source", headers=hdr).status_code == 200
        result = {"job_id": unit_id, "ok": True, "targets": [{"target": x["unit"]["target"], "improved": False}]}
        assert world.client.post(f"/runner/v1/jobs/{unit_id}/result", json=result, headers=hdr).json() == {
            "recorded": True}
    assert world.ctx.store.get(job.id).state == "succeeded"


def test_the_per_repository_limit_applies_to_leases(tmp_path, fake_github):
    w = make_world(tmp_path, fake_github, max_units_per_repo=1)
    with w.client:
        run_all(w)
        assert w.client.post("/runner/v1/lease", headers=w.runner("gpu-a")).status_code == 200
        assert w.client.post("/runner/v1/lease", headers=w.runner("gpu-b")).status_code == 204  # the repo's one GPU
