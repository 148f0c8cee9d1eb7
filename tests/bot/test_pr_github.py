"""From a labelled PR to a reviewable fusebot PR, against the App's fake GitHub (real bare repositories; every request
and response checked against GitHub's OpenAPI description): the webhook makes a job, a runner uploads real results
(harness verdicts, generated files), the outbox delivers: the PR into the labelled PR's branch with the files, the body
and the completed check run, and one status comment; a re-run updates the same PR; nothing faster opens none; a fork
gets a comment with the patch and nothing is pushed."""

from __future__ import annotations

import subprocess

from bot.publish import pr
from bot.publish.notify import sync_check_runs
from runner.contract import TargetResult
from runner.results.files import Provenance, slug, target_files
from tests.bot.helpers import REPO, comment_payload, initial_files, pr_payload
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


def test_labelled_pr_becomes_a_fusebot_pr_and_a_rerun_updates_it(world):
    job = label_and_run(world, number=2, sha=world.shas["feature"])
    [target] = [t["name"] for t in job["targets"]]
    [bot] = bot_pulls(world)
    assert (bot.base_ref, bot.head_ref) == ("feature", f"fusebot/feature/{target.lower()}")
    assert pr.find_marker(bot.body, "pr") == f"feature/{target.lower()}"
    v = real_verdicts()["fused"]
    assert f"| {v.timing.median_ms:.4g} | {v.timing.iqr_ms:.3g} | {v.timing.n} |" in bot.body
    files = branch_files(world, bot.head_ref)
    folder = f"fusebot_kernels/{slug(target)}"
    assert {f"{folder}/kernel.cpp", f"{folder}/dropin.py", f"{folder}/BENCHMARK.md"} <= set(files)
    assert files["models/attn.py"].endswith("# faster soon\n")  # built on the labelled PR's head
    [run] = [r for r in world.fake.check_runs.values() if r["head_sha"] == world.shas["feature"]]
    assert run["conclusion"] == "success" and bot.body.split("\n")[1].split(":")[0] in run["output"]["summary"]
    [status] = [c for c in world.fake.comments_on(REPO, 2) if "fusebot:status" in c]
    assert f"https://github.com/{REPO}/pull/{bot.number}" in status

    label_and_run(world, number=2, sha=world.shas["feature"])  # a re-run: the same PR, the same comment
    assert [p.number for p in bot_pulls(world)] == [bot.number]
    assert len([c for c in world.fake.comments_on(REPO, 2) if "fusebot:status" in c]) == 1
    assert len([r for r in world.fake.check_runs.values() if r["head_sha"] == world.shas["feature"]]) == 2


def test_nothing_faster_opens_no_pr(world):
    label_and_run(world, number=2, sha=world.shas["feature"], improved=False)
    assert bot_pulls(world) == []
    [run] = list(world.fake.check_runs.values())
    assert run["conclusion"] == "neutral" and "nothing beat eager" in run["output"]["summary"]
    [status] = world.fake.comments_on(REPO, 2)
    assert "no faster kernel" in status


def test_a_fork_gets_a_comment_with_the_patch_and_no_push(world):
    fork_sha = world.repo.commit({"models/attn.py": initial_files()["models/attn.py"] + "\n# from a fork\n"}, "fork",
                                 branch="fork")
    world.repo.push_ref(fork_sha, "refs/pull/3/head")
    world.fake.add_pull(Pull(REPO, 3, fork_sha, "patch-1", "forker/Hello-World", "main", world.shas["main"]))
    refs_before = subprocess.run(["git", "--git-dir", str(world.repo.bare), "for-each-ref"], check=True,
                                 capture_output=True, text=True).stdout
    label_and_run(world, number=3, sha=fork_sha, fork=True, head_ref="patch-1")
    refs_after = subprocess.run(["git", "--git-dir", str(world.repo.bare), "for-each-ref"], check=True,
                                capture_output=True, text=True).stdout
    assert refs_after == refs_before and bot_pulls(world) == []
    [comment] = [c for c in world.fake.comments_on(REPO, 3) if "fusebot:fork" in c]
    assert "git apply fusebot.patch" in comment and "new file mode 100644" in comment


def command(world, text: str, number: int, comment_id: int) -> None:
    world.fake.add_comment(REPO, number, comment_id, text, "maintainer")
    world.post("issue_comment", comment_payload(text, number=number, comment_id=comment_id))
    world.drain()


def test_explain_and_rerun_on_a_fusebot_pr(world):
    first = label_and_run(world, number=2, sha=world.shas["feature"])
    [bot] = bot_pulls(world)
    assert pr.find_marker(bot.body, "job") == first["id"]
    command(world, "/fusebot explain", bot.number, 950)
    [trace] = [c for c in world.fake.comments_on(REPO, bot.number) if "search trace" in c]
    assert first["id"][:12] in trace and "seed: verified" in trace
    command(world, "/fusebot rerun", bot.number, 951)
    rerun = [j for j in world.jobs() if j.id != first["id"]]
    assert len(rerun) == 1 and rerun[0].pr_number == 2 and rerun[0].spec.ref == "feature"
    assert rerun[0].sha == world.shas["feature"] and rerun[0].state == "queued"
    command(world, "/fusebot explain", 2, 952)  # not a fusebot PR: says where it works
    assert any("fusebot's own pull requests" in c for c in world.fake.comments_on(REPO, 2))
