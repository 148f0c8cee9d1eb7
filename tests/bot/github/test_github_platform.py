"""From a labelled PR to a reviewable fusebot PR, against the App's fake GitHub (real bare repositories; every request
and response checked against GitHub's OpenAPI description): the webhook makes a job, a runner uploads real results
(harness verdicts, generated files), the outbox delivers: the PR into the labelled PR's branch with the files, the body
and the completed check run, and one status comment; a re-run updates the same PR; nothing faster opens none; a fork
gets a comment with the patch and nothing is pushed."""

from __future__ import annotations

import subprocess

from bot.github.platform import find_marker
from runner.results.files import slug
from tests.bot.app_flow import bot_pulls, branch_files, command, label_and_run
from tests.bot.helpers import REPO, initial_files
from tests.fakes.github_server import Pull
from tests.verdicts import real_verdicts


def test_labelled_pr_becomes_a_fusebot_pr_and_a_rerun_updates_it(world):
    job = label_and_run(world, number=2, sha=world.shas["feature"])
    [target] = [t["name"] for t in job["targets"]]
    [bot] = bot_pulls(world)
    assert (bot.base_ref, bot.head_ref) == ("feature", f"fusebot/feature/{target.lower()}")
    assert find_marker(bot.body, "pr") == f"feature/{target.lower()}"
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
    first, *parts = [c for c in world.fake.comments_on(REPO, 3) if "fusebot:fork" in c]
    assert "git apply fusebot-*.patch" in first and f"The patch comes in {1 + len(parts)} parts" in first
    assert all("new file mode 100644" in c for c in [first, *parts])


def test_explain_and_rerun_on_a_fusebot_pr(world):
    first = label_and_run(world, number=2, sha=world.shas["feature"])
    [bot] = bot_pulls(world)
    assert find_marker(bot.body, "job") == first["id"]
    command(world, "/fusebot explain", bot.number, 950)
    [trace] = [c for c in world.fake.comments_on(REPO, bot.number) if "search trace" in c]
    assert first["id"][:12] in trace and "seed: verified" in trace
    command(world, "/fusebot rerun", bot.number, 951)
    rerun = [j for j in world.jobs() if j.id != first["id"]]
    assert len(rerun) == 1 and rerun[0].pr_number == 2 and rerun[0].spec.ref == "feature"
    assert rerun[0].sha == world.shas["feature"] and rerun[0].state == "queued"
    command(world, "/fusebot explain", 2, 952)  # not a fusebot PR: says where it works
    assert any("fusebot's own pull requests" in c for c in world.fake.comments_on(REPO, 2))
