"""The status comment and a fork's comments from real Verdicts: markers, speedups, the patch whole (in parts of
whole files when it is larger than a comment), the benchmark tables."""

from __future__ import annotations

from bot.github.platform import find_marker
from bot.publish.comments import fork_comments, status_comment
from bot.publish.text import BODY_LIMIT, CUT_NOTE
from bot.publish.verdicts import speedup, target_table
from tests.bot.results import improved_result, plan_of, slow_result
from tests.verdicts import real_verdicts


def test_status_comment_and_fork_comment():
    plan = plan_of(improved_result(), slow_result())
    c = status_comment(7, "done", plan, pr_url="https://example.test/pr/9")
    assert find_marker(c, "status") == "pr-7" and "https://example.test/pr/9" in c
    s = speedup(real_verdicts()["fused"])
    assert f"{s:.2f}x faster" in c
    small = "diff --git a/k.cpp b/k.cpp\n" + "+// line\n" * 100
    [f] = fork_comments(plan, small)
    assert len(f) <= BODY_LIMIT and find_marker(f, "fork") == "pr-7"
    assert "git apply fusebot.patch" in f and small in f and target_table(plan.results[0]) in f

def test_a_fork_patch_larger_than_a_comment_comes_in_parts_of_whole_files():
    plan = plan_of(improved_result())
    files = [f"diff --git a/{n} b/{n}\n" + f"+// {n}\n" * 4_000 for n in ("a.py", "b.py", "c.py")]  # ~40 KB each
    huge = "diff --git a/h.bin b/h.bin\n" + "+x\n" * 40_000  # one file over a comment
    comments = fork_comments(plan, "".join(files) + huge)
    assert len(comments) == 3 and all(len(c) <= BODY_LIMIT for c in comments)
    assert [find_marker(c, "fork") for c in comments] == ["pr-7", "pr-7-part-2", "pr-7-part-3"]
    assert "The patch comes in 3 parts, in this comment and the next 2" in comments[0]
    for k, (c, f) in enumerate(zip(comments, files, strict=True), 1):
        assert f"part {k} of 3" in c and f in c and CUT_NOTE not in c
    assert "`h.bin` (" in comments[0] and "is not in the patch" in comments[0] and "+x\n" not in "".join(comments)
    assert target_table(plan.results[0]) in comments[0]
