"""Benchmark and hygiene jobs end to end, against the App's fake GitHub (every request and response checked against
GitHub's OpenAPI description) with a real runner run (the harness on the CPU backend, no stubs):

- `/fusebot benchmark` on a fusebot PR queues a benchmark job at the PR's head; the runner re-measures the kernel from
  the branch and the numbers come back as a comment and on a `fusebot benchmark` check run; a maintainer's edit that
  breaks the kernel is measured as edited and reported "not verified" with the harness's reason;
- the nightly tick queues a hygiene job beside the search only when the default branch holds fusebot kernels; a
  merged kernel the module changed under ends in the hygiene PR (commands on that PR work too);
- a re-run whose files differ from the branch's only in the provenance date commits nothing; the PR is updated in
  place, and a real change still commits.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bot.features.nightly import tick
from bot.github.platform import find_marker, marker
from bot.publish.benchmark import conclusion
from bot.publish.deliver import deliver_job
from bot.publish.notify import sync_check_runs
from runner.contract import TargetResult
from tests.bot.app_flow import bot_pulls, branch_files, command
from tests.bot.helpers import REPO, git, pr_payload
from tests.bot.kernel_world import (
    EXAMPLE,
    FOLDER,
    KERNELS,
    LEASE,
    MODULE_PATH,
    break_kernel,
    kernel_files,
    merged,
    run_leased,
)
from tests.fakes.github_server import Pull
from tests.verdicts import real_verdicts

KERNEL = f"{KERNELS}/{FOLDER}/kernel.cpp"


@pytest.fixture
def cpu_runner(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def label_and_upload(world, *, number: int, sha: str, now: datetime | None = None, edit=None) -> dict:
    """A labelled-PR webhook; the runner's search result for the epilogue target is the fused kernel (its real
    harness verdict and generated files, provenance dated `now`); the outbox delivers it."""
    world.post("pull_request", pr_payload("labeled", number=number, head_sha=sha, base_sha=world.shas["main"],
                                          label="optimize-kernels"))
    world.drain()
    sync_check_runs(world.ctx)
    v = real_verdicts()["fused"]
    ours_unit = None
    while (r := world.client.post("/runner/v1/lease", headers=world.runner())).status_code == 200:
        leased = r.json()  # the job's targets are units: each leased and uploaded, the job gathered after the last
        job = leased["job"]
        targets = []
        for t in job["targets"]:
            ours = t["file"] == MODULE_PATH
            files = kernel_files(REPO, job["sha"], now=now) if ours else {}
            if ours and edit is not None:
                files = edit(files)
            if ours:  # the job as the bot knows it (a unit's id is the job's, with its index)
                ours_unit = {**job, "id": (leased.get("unit") or {}).get("job_id", job["id"])}
            targets.append(TargetResult(target=t["name"], improved=ours, verdict=v, files=files, file=t["file"],
                                        class_name=t["class_name"], message="" if ours else "nothing beat eager",
                                        trace_markdown="### Round 1\nseed: verified").model_dump(mode="json"))
        body = {"job_id": job["id"], "ok": True, "targets": targets,
                "environment": v.environment.model_dump(mode="json")}
        hdr = {**world.runner(), LEASE: leased["lease_token"]}
        assert world.client.post(f"/runner/v1/jobs/{job['id']}/result", json=body,
                                 headers=hdr).json() == {"recorded": True}
    job = ours_unit
    sync_check_runs(world.ctx)
    return job


def epilogue_pr(world) -> str:
    """PR 2 (branch `feature`) now adds the example module: its search gives the fused kernel."""
    sha = world.repo.commit({MODULE_PATH: EXAMPLE.read_text()}, "the epilogue", branch="feature")
    world.fake.pulls[(REPO, 2)].head_sha = sha
    return sha


def kernel_jobs(world, kind: str):
    return [j for j in world.jobs() if j.spec.kind == kind]


def bot_comments(world, number: int, kind: str, key: str) -> list[str]:
    return [c for c in world.fake.comments_on(REPO, number) if find_marker(c, kind) == key]


def runs_named(world, name: str, sha: str) -> list[dict]:
    return [r for r in world.fake.check_runs.values() if r["name"] == name and r["head_sha"] == sha]


def table_row(label: str, t) -> str:
    return f"| {label} | {t.median_ms:.4g} | {t.iqr_ms:.3g} | {t.n} |"


def test_benchmark_remeasures_the_branch_and_reports_a_broken_edit(world, cpu_runner):
    feature = epilogue_pr(world)
    search = label_and_upload(world, number=2, sha=feature)
    [bot] = bot_pulls(world)
    assert find_marker(bot.body, "job") == search["id"] and KERNEL in branch_files(world, bot.head_ref)

    command(world, "/fusebot benchmark", bot.number, 960)
    [job] = kernel_jobs(world, "benchmark")
    assert (job.sha, job.spec.ref, job.pr_number, job.trigger) == (bot.head_sha, bot.head_ref, bot.number, "comment")
    assert job.spec.kernels == [FOLDER] and job.spec.targets == [] and job.state == "queued"
    assert any(f"Re-measuring `{FOLDER}`" in c for c in world.fake.comments_on(REPO, bot.number))
    sync_check_runs(world.ctx)
    [run] = runs_named(world, "fusebot benchmark", bot.head_sha)
    assert run["status"] == "queued" and "re-measure 1 kernel" in run["output"]["title"]

    result = run_leased(world)  # the real harness, on the files of the branch
    sync_check_runs(world.ctx)
    [r] = result.targets
    v = r.verdict
    assert v.candidate_id == f"merged-{FOLDER}" and r.kernel == KERNEL and v.accepted and r.dropin_check.passed
    assert v.confirmation is not None and v.timing.n > 0
    [comment] = bot_comments(world, bot.number, "benchmark", job.id)
    for row in (table_row("PyTorch eager", v.baselines.eager), table_row("torch.compile", v.baselines.compile),
                table_row("**fusebot**", v.timing)):
        assert row in comment, (row, comment)
    assert f"Kernel measured: `{KERNEL}`" in comment and "Not verified" not in comment
    if r.improved:
        assert "**Verified and faster**" in comment
    else:  # not faster, by too little, or not in a user's call back to back (the CPU's timings decide which)
        assert r.message.startswith("verified, ") and " but " in r.message, r.message
        assert f"**Verified**, {r.message.removeprefix('verified, ')}" in comment
    assert f"{len(v.trials)}/{len(v.trials)} trials passed" in comment
    [run] = runs_named(world, "fusebot benchmark", bot.head_sha)
    assert run["status"] == "completed" and run["conclusion"] == conclusion(result.targets) != "failure"

    # a maintainer edits the kernel on fusebot's branch; benchmarking again measures it as edited
    git(world.repo.work, "fetch", "-q", "origin", f"{bot.head_ref}:{bot.head_ref}")
    kernel_text = branch_files(world, bot.head_ref)[KERNEL]
    edited = world.repo.commit({KERNEL: break_kernel(kernel_text)}, "tweak the threshold", branch=bot.head_ref)
    world.fake.pulls[(REPO, bot.number)].head_sha = edited
    command(world, "/fusebot benchmark", bot.number, 961)
    second = next(j for j in kernel_jobs(world, "benchmark") if j.id != job.id)
    assert second.sha == edited
    [r2] = run_leased(world).targets
    sync_check_runs(world.ctx)
    assert not r2.verdict.accepted and not r2.improved and r2.message.startswith("not verified: mismatch")
    [broken] = bot_comments(world, bot.number, "benchmark", second.id)
    assert "**Not verified**" in broken and "- mismatch:" in broken and "**1 of 1" not in broken
    passed = sum(t.passed for t in r2.verdict.trials)
    assert f"{passed}/{len(r2.verdict.trials)} trials passed" in broken and passed < len(r2.verdict.trials)
    [run] = runs_named(world, "fusebot benchmark", edited)
    assert run["conclusion"] == "failure" and run["output"]["title"] == "Not verified: ScaledBiasReLU"
    assert len(bot_comments(world, bot.number, "benchmark", job.id)) == 1  # the first answer stays as it was

    again = world.ctx.store.get(second.id)
    deliver_job(world.ctx.platform(again.installation_id, again.repo), again, None)  # delivered again: edits, never adds
    assert len(bot_comments(world, bot.number, "benchmark", second.id)) == 1
    assert [p.number for p in bot_pulls(world)] == [bot.number]


def test_benchmark_on_a_pr_without_kernels_answers_so(world):
    feature = epilogue_pr(world)
    label_and_upload(world, number=2, sha=feature)
    [bot] = bot_pulls(world)
    git(world.repo.work, "fetch", "-q", "origin", f"{bot.head_ref}:{bot.head_ref}")
    gone = world.repo.commit({path: None for path in branch_files(world, bot.head_ref) if path.startswith(KERNELS)},
                             "drop the kernel", branch=bot.head_ref)
    world.fake.pulls[(REPO, bot.number)].head_sha = gone
    command(world, "/fusebot benchmark", bot.number, 962)
    assert kernel_jobs(world, "benchmark") == []
    assert any("nothing to measure" in c for c in world.fake.comments_on(REPO, bot.number))


def nightly(world, slot: datetime) -> list:
    """The repository's nightly slot comes due: the tick queues it and the background handles it."""
    store = world.ctx.store
    before = {j.id for j in world.jobs()}
    store.set_schedule(REPO, enabled=True, cron="0 3 * * *", timezone="UTC", next_run_at=slot)
    assert len(tick(store, slot + timedelta(minutes=1))) == 1
    world.drain()
    return [j for j in world.jobs() if j.id not in before]


def test_nightly_queues_hygiene_only_when_the_default_branch_holds_kernels(world):
    slot = datetime(2026, 1, 1, 3, tzinfo=UTC)
    [search] = nightly(world, slot)  # no fusebot kernels on main: the search only
    assert search.spec.kind == "search" and search.trigger == "schedule"

    main = world.repo.commit({MODULE_PATH: EXAMPLE.read_text(), **merged(kernel_files())}, "merge fusebot's PR")
    jobs = nightly(world, slot + timedelta(days=1))
    assert sorted(j.spec.kind for j in jobs) == ["hygiene", "search"]
    [hygiene] = [j for j in jobs if j.spec.kind == "hygiene"]
    assert (hygiene.sha, hygiene.spec.ref, hygiene.trigger, hygiene.pr_number) == (main, "main", "schedule", None)
    assert hygiene.spec.kernels == [FOLDER] and hygiene.spec.kernels_dir == KERNELS
    world.drain()  # handling the slot's delivery again records nothing new
    assert len(world.jobs()) == 3


def test_a_stale_merged_kernel_ends_in_the_hygiene_pr(world, cpu_runner):
    world.repo.commit({MODULE_PATH: EXAMPLE.read_text(), **merged(kernel_files())}, "merge fusebot's PR")
    gelu = EXAMPLE.read_text().replace("torch.relu(", "torch.nn.functional.gelu(")
    main = world.repo.commit({MODULE_PATH: gelu}, "gelu instead of relu")  # the kernel still computes relu
    jobs = nightly(world, datetime(2026, 1, 1, 3, tzinfo=UTC))
    [search] = [j for j in jobs if j.spec.kind == "search"]
    world.ctx.store.cancel(REPO, job_id=search.id)  # (the search is another test's business)
    sync_check_runs(world.ctx)

    [r] = run_leased(world).targets
    sync_check_runs(world.ctx)
    assert not r.improved and r.message.startswith("no longer correct: mismatch")
    [hyg] = [p for p in bot_pulls(world) if p.head_ref == "fusebot/main/hygiene"]
    [job] = kernel_jobs(world, "hygiene")
    assert find_marker(hyg.body, "pr") == "main/hygiene" and find_marker(hyg.body, "job") == job.id
    assert "no longer correct" in hyg.body and hyg.base_ref == "main"
    files = branch_files(world, hyg.head_ref)
    assert KERNEL not in files and f"{KERNELS}/{FOLDER}/BENCHMARK.md" not in files
    assert "from examples.mlp_epilogue import ScaledBiasReLU" in files[f"{KERNELS}/{FOLDER}/dropin.py"]
    [run] = runs_named(world, "fusebot hygiene", main)
    assert run["conclusion"] == "neutral" and f"/pull/{hyg.number}" in run["output"]["summary"]

    # on the hygiene PR: `benchmark` measures the kernels it removes as they are on main; `rerun` is hygiene again
    command(world, "/fusebot benchmark", hyg.number, 970)
    [bench] = kernel_jobs(world, "benchmark")
    assert (bench.sha, bench.pr_number, bench.spec.kernels) == (main, hyg.number, [FOLDER])
    command(world, "/fusebot rerun", hyg.number, 971)
    assert len(kernel_jobs(world, "hygiene")) == 2 and [j.id for j in kernel_jobs(world, "search")] == [search.id]


def test_a_rerun_with_identical_files_commits_nothing(world):
    feature = epilogue_pr(world)
    day = datetime(2026, 1, 1, 3, tzinfo=UTC)
    label_and_upload(world, number=2, sha=feature, now=day)
    [bot] = bot_pulls(world)
    first = git(world.repo.bare, "rev-parse", bot.head_ref)
    assert f"date: {day.isoformat()}" in branch_files(world, bot.head_ref)[KERNEL]

    label_and_upload(world, number=2, sha=feature, now=day + timedelta(days=1))  # the same kernel, a day later
    assert git(world.repo.bare, "rev-parse", bot.head_ref) == first  # no new commit for a new date
    assert [p.number for p in bot_pulls(world)] == [bot.number]
    assert len(world.fake.calls_to("PATCH", f"/pulls/{bot.number}")) == 1  # the PR itself was updated in place

    def changed(files: dict[str, str]) -> dict[str, str]:
        return {**files, "scaledbiasrelu/kernel.cpp": files["scaledbiasrelu/kernel.cpp"] + "// tuned\n"}

    label_and_upload(world, number=2, sha=feature, now=day + timedelta(days=2), edit=changed)
    assert git(world.repo.bare, "rev-parse", bot.head_ref) != first  # a real change still commits
    assert branch_files(world, bot.head_ref)[KERNEL].endswith("// tuned\n")
    assert [p.number for p in bot_pulls(world)] == [bot.number]


def test_a_fork_dressed_as_a_fusebot_pr_gets_no_benchmark(world):
    """fusebot never opens a PR from a fork: a fork's branch named `fusebot/...` with a copied job marker runs nothing."""
    search = label_and_upload(world, number=2, sha=epilogue_pr(world))
    fork_sha = world.repo.commit({MODULE_PATH: EXAMPLE.read_text(), **merged(kernel_files())}, "fork", branch="fork")
    world.repo.push_ref(fork_sha, "refs/pull/7/head")
    world.fake.add_pull(Pull(REPO, 7, fork_sha, "fusebot/main/x", "forker/Hello-World", "main", world.shas["main"],
                             body=marker("job", search["id"])))
    command(world, "/fusebot benchmark", 7, 980)
    assert kernel_jobs(world, "benchmark") == []
    assert any("fusebot's own pull requests" in c for c in world.fake.comments_on(REPO, 7))
