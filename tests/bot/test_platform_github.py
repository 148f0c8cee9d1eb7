"""The GitHub platform through PyGithub against a real HTTP server whose every request is checked against GitHub's
OpenAPI description: the same publishing flow as the local platform: one branch and one PR per group, updated in
place; the status comment edited, not duplicated; no PR when nothing improved; a fork gets a comment, not a push."""

from __future__ import annotations

from github import Auth, Github

from bot import pr
from bot.platform_github import GitHubPlatform
from bot.publish import branch_files, publish
from tests.bot.fake_git_host import FakeGitHost
from tests.bot.test_pr_body import improved_result, plan_of, slow_result

REPO = "acme/models"
FILES = {"examples/mlp_epilogue.py": "# the user's module\n"}


def platform_for(fake: FakeGitHost) -> GitHubPlatform:
    gh = Github(auth=Auth.Token("test-token"), base_url=fake.base, retry=None, lazy=True,
                seconds_between_requests=None, seconds_between_writes=None)
    return GitHubPlatform(gh, REPO)


def test_labelled_pr_opens_then_updates_one_pr_with_the_files_check_run_and_status_comment():
    with FakeGitHost(REPO, FILES) as fake:
        gh = platform_for(fake)
        base = gh.head_sha("main")
        plan = plan_of(improved_result(), slow_result())
        run = gh.create_check_run(base, pr.CHECK_NAME, pr.check_queued(["ScaledBiasReLU", "Slow"]))
        first = publish(gh, plan, base_sha=base, check_run_id=run, label_pr=7)
        again = publish(gh, plan, base_sha=base, label_pr=7)
        assert fake.errors == []
        assert first.pull_request.created and not again.pull_request.created
        assert again.pull_request.number == first.pull_request.number and not again.branch.changed
        assert [p["head"] for p in fake.pulls] == ["fusebot/main/examples"]
        assert pr.find_marker(fake.pulls[0]["body"], "pr") == "main/examples"
        assert fake.files_at("fusebot/main/examples") == {**FILES, **branch_files(plan)}
        assert fake.commits[fake.refs["refs/heads/fusebot/main/examples"]]["parents"] == [base]
        [status] = [c for c in fake.comments if c["issue"] == 7]
        assert first.pull_request.url in status["body"]
        assert fake.check_runs[0]["conclusion"] == "success" and fake.check_runs[0]["status"] == "completed"
        assert ("POST", "/repos/{owner}/{repo}/git/trees") in fake.requests


def test_no_improvement_opens_no_pr_and_a_fork_gets_a_comment_not_a_push():
    with FakeGitHost(REPO, FILES) as fake:
        gh = platform_for(fake)
        base = gh.head_sha("main")
        run = gh.create_check_run(base, pr.CHECK_NAME, pr.check_queued(["Slow"]))
        out = publish(gh, plan_of(slow_result()), base_sha=base, check_run_id=run, label_pr=7)
        assert out.pull_request is None and fake.pulls == [] and fake.check_runs[0]["conclusion"] == "neutral"
        refs_before = dict(fake.refs)
        publish(gh, plan_of(improved_result()), base_sha=base, label_pr=8, fork=True)
        assert fake.refs == refs_before and fake.pulls == []  # nothing pushed anywhere
        [comment] = [c for c in fake.comments if c["issue"] == 8]
        assert "git apply fusebot.patch" in comment["body"] and "new file mode 100644" in comment["body"]
        assert fake.errors == []
