"""The local platform and the publishing flow on a real git repository: one branch and one PR however often it runs,
files updated in place, nothing committed when nothing changed, no PR when nothing improved, a patch comment (and no
branch) for a fork, the working tree and checked-out branch never touched."""

from __future__ import annotations

import inspect
import subprocess
from pathlib import Path

import git
import pytest

from bot.github.github_platform import GitHubPlatform
from bot.github.local_platform import LocalPlatform
from bot.github.platform import Annotation, CheckOutput, Platform, PlatformError, can_write, find_marker, marker
from bot.publish.checks import CHECK_NAME, check_queued
from bot.publish.propose import branch_files, propose
from tests.bot.results import improved_result, plan_of, slow_result


def make_repo(tmp: Path) -> git.Repo:
    repo = git.Repo.init(tmp / "repo", initial_branch="main")
    (tmp / "repo" / "examples").mkdir()
    (tmp / "repo" / "examples" / "mlp_epilogue.py").write_text("# the user's module\n")
    repo.index.add(["examples/mlp_epilogue.py"])
    repo.index.commit("initial")
    return repo


def branch_commits(repo: git.Repo, branch: str) -> list[str]:
    return repo.git.rev_list(f"main..{branch}").split()


def test_a_rerun_updates_the_same_branch_and_pr(tmp_path):
    repo = make_repo(tmp_path)
    platform = LocalPlatform(Path(repo.working_tree_dir))
    base = platform.head_sha("main")
    plan = plan_of(improved_result(), slow_result())
    run = platform.create_check_run(base, CHECK_NAME, check_queued(["ScaledBiasReLU", "Slow"]))
    first = propose(platform, plan, base_sha=base, check_run_id=run, label_pr=7)
    assert first.pull_request.created and first.branch.changed
    assert branch_commits(repo, plan.branch) == [first.branch.sha]
    tree = repo.commit(plan.branch).tree
    for path, text in branch_files(plan).items():
        assert (tree / path).data_stream.read().decode() == text
    again = propose(platform, plan, base_sha=base, label_pr=7)
    assert not again.pull_request.created and again.pull_request.number == first.pull_request.number
    assert not again.branch.changed and again.branch.sha == first.branch.sha  # nothing new to commit
    changed = plan_of(improved_result(trace="### Round 1\nanother search"), slow_result())
    bench = next(p for p in changed.results[0].files if p.endswith("BENCHMARK.md"))
    changed.results[0].files[bench] += "\nre-measured\n"
    third = propose(platform, changed, base_sha=base, label_pr=7)
    assert third.pull_request.number == first.pull_request.number and third.branch.changed
    assert branch_commits(repo, plan.branch) == [third.branch.sha]  # rebuilt on the base, not stacked
    pulls = platform.pulls()
    assert len(pulls) == 1 and pulls[0].branch == "fusebot/main/examples"
    assert "another search" in platform.pull_body(pulls[0].number)
    assert "re-measured" in (repo.commit(plan.branch).tree / f"fusebot_kernels/{bench}").data_stream.read().decode()
    assert [b.name for b in repo.branches if b.name.startswith("fusebot/")] == ["fusebot/main/examples"]
    comments = platform.comments(7)
    assert len(comments) == 1 and find_marker(comments[0].body, "status") == "pr-7"
    assert platform.check_runs()[0].conclusion == "success"
    assert repo.active_branch.name == "main" and not repo.is_dirty(untracked_files=True)


def test_the_base_moving_rebuilds_the_branch_on_it(tmp_path):
    repo = make_repo(tmp_path)
    platform = LocalPlatform(Path(repo.working_tree_dir))
    plan = plan_of(improved_result())
    propose(platform, plan, base_sha=platform.head_sha("main"))
    (Path(repo.working_tree_dir) / "README.md").write_text("new\n")
    repo.index.add(["README.md"])
    repo.index.commit("base moves")
    update = propose(platform, plan, base_sha=platform.head_sha("main")).branch
    assert update.changed and repo.commit(plan.branch).parents[0].hexsha == platform.head_sha("main")
    assert len(platform.pulls()) == 1


def test_nothing_improved_opens_no_pr(tmp_path):
    repo = make_repo(tmp_path)
    platform = LocalPlatform(Path(repo.working_tree_dir))
    base = platform.head_sha("main")
    run = platform.create_check_run(base, CHECK_NAME, check_queued(["Slow"]))
    out = propose(platform, plan_of(slow_result()), base_sha=base, check_run_id=run, label_pr=7)
    assert out.pull_request is None and out.conclusion == "neutral"
    assert platform.pulls() == [] and not [b for b in repo.branches if b.name.startswith("fusebot/")]
    assert platform.check_runs()[0].conclusion == "neutral"
    assert "no faster kernel" in platform.comments(7)[0].body


def test_a_fork_gets_a_patch_comment_and_no_branch(tmp_path):
    repo = make_repo(tmp_path)
    platform = LocalPlatform(Path(repo.working_tree_dir))
    base = platform.head_sha("main")
    plan = plan_of(improved_result())
    propose(platform, plan, base_sha=base, label_pr=7, fork=True)
    propose(platform, plan, base_sha=base, label_pr=7, fork=True)
    assert platform.pulls() == [] and not [b for b in repo.branches if b.name.startswith("fusebot/")]
    comments = platform.comments(7)  # the drop-in alone is over half a comment: the patch takes several, posted once
    n = len(comments)
    assert n >= 2 and f"The patch comes in {n} parts" in comments[0].body, [c.body[:200] for c in comments]
    patches = []
    for k, comment in enumerate(comments, 1):
        patch = comment.body.split("```diff\n", 1)[1].split("\n```", 1)[0] + "\n"
        patches.append(tmp_path / f"fusebot-{k}.patch")
        patches[-1].write_text(patch)
        assert f"part {k} of {n}" in comment.body
    subprocess.run(["git", "apply", "--check", str(patches[-1])], cwd=repo.working_tree_dir,
                   check=True)  # each part applies by itself
    subprocess.run(["git", "apply", *map(str, patches)], cwd=repo.working_tree_dir, check=True)
    for path, text in branch_files(plan).items():
        assert (Path(repo.working_tree_dir) / path).read_text() == text, path


def test_refuses_to_move_a_checked_out_branch(tmp_path):
    repo = make_repo(tmp_path)
    platform = LocalPlatform(Path(repo.working_tree_dir))
    with pytest.raises(PlatformError, match="checked out"):
        platform.commit_files("main", platform.head_sha("main"), {"x.txt": "x"}, "m")
    with pytest.raises(PlatformError, match="not a git repository"):
        LocalPlatform(tmp_path / "nowhere")


def test_the_local_platform_answers_what_the_apps_features_ask(tmp_path):
    """The seam's other half on the local platform: a PR's head, files and body, comments, reactions, check runs with
    annotations and buttons, and the owner's permission."""
    repo = make_repo(tmp_path)
    platform = LocalPlatform(Path(repo.working_tree_dir))
    base = platform.head_sha("main")
    update = platform.commit_files("feature", base, {"models/new.py": "x = 1\n"}, "new module")
    ref = platform.upsert_pull_request(branch="feature", base="main", title="t", body=marker("pr", "k"), key="k")
    pull = platform.pull(ref.number)
    assert (pull.head_sha, pull.head_ref, pull.base_ref, pull.state, pull.is_fork) == (
        update.sha, "feature", "main", "open", False)
    assert platform.pull_files(ref.number) == ["models/new.py"]
    assert find_marker(platform.pull_body(ref.number), "pr") == "k"
    first = platform.post_comment(ref.number, "hello")
    assert platform.post_comment(ref.number, "again") == first + 1  # a plain comment is never found again
    platform.react_to_comment(ref.number, first, "+1")
    assert [c.body for c in platform.comments(ref.number)] == ["hello", "again"]
    out = CheckOutput("completed", "Marked files need fixing", "s", "failure",
                      annotations=(Annotation("models/new.py", 1, "syntax error: x"),), actions=({"label": "x"},))
    run = platform.create_check_run(update.sha, "fusebot", out, external_id="job-1")
    [stored] = platform.check_runs()
    assert (stored.id, stored.external_id, stored.conclusion) == (run, "job-1", "failure")
    assert stored.annotations == [Annotation("models/new.py", 1, "syntax error: x").as_api()]
    assert platform.find_check_run(update.sha, "fusebot") == run  # found again by commit and name
    assert platform.find_check_run(update.sha, "fusebot config") is None and platform.find_check_run(base, "fusebot") is None
    assert can_write(platform, "anyone")
    with pytest.raises(PlatformError):
        platform.pull(99)


def test_both_platforms_implement_the_whole_seam_with_its_signatures():
    seam = {n: inspect.signature(f) for n, f in vars(Platform).items() if callable(f) and not n.startswith("_")}
    assert "create_check_run" in seam and "pull_files" in seam
    for impl in (LocalPlatform, GitHubPlatform):
        assert {n: inspect.signature(getattr(impl, n)) for n in seam} == seam, impl.__name__
