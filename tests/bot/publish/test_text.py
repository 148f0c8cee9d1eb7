"""What may be published: nothing fusebot publishes (PR bodies, check runs, comments, benchmark answers) holds a
credential or a path outside the repository, and `clip` cuts to GitHub's limit, saying so."""

from __future__ import annotations

from bot.publish.benchmark import benchmark_check, benchmark_comment
from bot.publish.body import pr_body
from bot.publish.checks import check_completed
from bot.publish.comments import explain_comments, fork_comments, status_comment
from bot.publish.text import clip
from runner.contract import Baselines, Job, JobResult, TargetResult, Verdict
from tests.bot.results import plan_of
from tests.fakes.evaluators import timing

TOKEN = "ghp_" + "A1b2C3d4" * 5  # a fake token of GitHub's shape

SECRETS = [TOKEN, "github_pat_" + "x9" * 20, "sk-proj-" + "k" * 32, "Bearer abc.def.ghi",
           "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC", "/tmp/fusebot-job-1234/src", "/proc/1/environ"]

LEAKY = (f"runtime: read /proc/1/environ: GITHUB_TOKEN={TOKEN} key=github_pat_{'x9' * 20}; "
         f"OPENAI_API_KEY=sk-proj-{'k' * 32}; headers Authorization: Bearer abc.def.ghi\n"
         "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"
         "build: /tmp/fusebot-job-1234/src/models/mlp.py:3: error")

def leaky_result(improved: bool) -> TargetResult:
    v = Verdict(candidate_id="c1", problem="p", accepted=improved, reasons=[LEAKY], warnings=[LEAKY],
                baselines=Baselines(eager=timing(2.0), compile=timing(1.0), compile_error=None),
                timing=timing(0.5) if improved else None)
    return TargetResult(target="models.mlp.MLP", improved=improved, verdict=v, message=LEAKY, class_name="MLP",
                        file="models/mlp.py", trace_markdown=f"| c1 | rejected | {LEAKY} |",
                        files={"mlp/kernel.cpp": "//"} if improved else {})

def test_what_is_published_holds_no_credential_and_no_path_outside_the_repository():
    texts = [pr_body(plan_of(leaky_result(True), leaky_result(False)))]
    for plan in (plan_of(leaky_result(True)), plan_of(leaky_result(False))):
        out = check_completed(plan, pr_url="https://github.com/acme/models/pull/3")
        patch = f"diff --git a/k.cpp b/k.cpp\n--- /dev/null\n+++ b/k.cpp\n+// {TOKEN}\n"
        [fork] = fork_comments(plan, patch)
        assert "--- /dev/null" in fork  # a patch keeps its paths, so that it still applies
        texts += [out.summary, out.text, status_comment(7, "done", plan), fork]
    texts += [check_completed(plan_of(), error=LEAKY).summary, *explain_comments("job1", [leaky_result(False)])]
    job = Job(id="b1", repo="acme/models", sha="c0ffee" * 6 + "abcd", targets=[], kind="benchmark", pr_number=3)
    result = JobResult(job_id="b1", ok=True, targets=[leaky_result(False)])
    texts += [benchmark_comment(job, result), benchmark_check(job, result).summary]
    for text in texts:
        assert LEAKY not in text and not [s for s in SECRETS if s in text], text
    body = texts[0]
    assert "…/mlp.py:3: error" in body  # the path's last part stays: enough to find the line in the repository
    assert "https://github.com/acme/models/pull/3" in texts[1]  # URLs are not paths

def test_clip_cuts_to_the_limit_and_says_so():
    assert clip("x" * 10, limit=100) == "x" * 10
    cut = clip("y" * 500, limit=100)
    assert len(cut) == 100 and cut.endswith("*…cut to fit GitHub's limit.*")
    assert clip("see /dev/null and fusebot_kernels/a/b.cu and 1/2 and `/fusebot run`") == \
        "see /dev/null and fusebot_kernels/a/b.cu and 1/2 and `/fusebot run`"
