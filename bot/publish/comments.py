"""The comments fusebot posts: the labelled PR's one status comment, a fork's results with their patch (fusebot never
pushes to a fork), and `/fusebot explain`'s whole search traces. Each carries a marker by which it is found again and
edited in place.
"""

from __future__ import annotations

from bot.github.patch import split_patch
from bot.github.platform import marker
from bot.publish.plan import PullRequestPlan
from bot.publish.text import BODY_LIMIT, clip, scrub
from bot.publish.verdicts import environment_line, speedup, target_table, times, verdict_line
from runner.contract import TargetResult


def status_comment(pr_number: int, state: str, plan: PullRequestPlan | None = None, pr_url: str | None = None,
                   detail: str = "") -> str:
    """The one status comment on a labelled PR (found again by its marker and edited in place)."""
    lines = [marker("status", f"pr-{pr_number}"), f"**fusebot**: {state}"]
    if detail:
        lines.append(detail)
    if plan is not None:
        lines += ["", verdict_line(plan.results)]
        for r in plan.results:
            s = speedup(r.verdict) if r.improved else None
            lines.append(f"- `{r.class_name or r.target}`: " + (f"{times(s)} faster" if s is not None else
                                                               (r.message or "no faster kernel")))
    if pr_url:
        lines += ["", f"Kernels, drop-ins, tests and benchmarks: {pr_url}"]
    return clip("\n".join(lines))


def fork_comments(plan: PullRequestPlan, patch: str, limit: int = BODY_LIMIT) -> list[str]:
    """Results for a PR from a fork: fusebot never pushes to a fork, so the patch comes in comments, whole files in
    each, as many comments as it takes (a drop-in alone is tens of kilobytes; a comment holds 65536 characters)."""
    patch = scrub(patch, keep_paths=True)
    table = [target_table(r) + "\n" for r in plan.results] + [environment_line(plan.environment), ""]
    table_text = scrub("\n".join(table))
    frame = 400  # a part's marker, title and fences
    parts, too_large = split_patch(patch, limit - frame, first_room=limit - frame - 1200 - len(table_text))
    n = len([p for p in parts if p]) or 1
    if n == 1:
        how = "```sh\n# save the patch below as fusebot.patch, then\ngit apply fusebot.patch\n```"
    else:
        where = f"this comment and the next {n - 1}" if parts[0] else f"the next {n} comments"
        how = (f"The patch comes in {n} parts, in {where}, whole files in each, so each part applies by itself:"
               f"\n\n```sh\n# save part k as fusebot-k.patch (k = 1..{n}), then\n"
               f"git apply fusebot-*.patch\n```")
    head = [marker("fork", f"pr-{plan.source_pr or 0}"), verdict_line(plan.results), "",
            "This pull request comes from a fork, so fusebot does not push to it. Apply the kernels yourself:", "",
            how, ""]
    for section in too_large:
        path = section.split("\n", 1)[0].removeprefix("diff --git a/").split(" b/", 1)[0]
        head.append(f"*`{path}` ({len(section)} characters of patch) is larger than a comment holds and is not in "
                    "the patch: run `fusebot optimize` on the module to get it.*\n")
    first = scrub("\n".join(head)) + table_text
    out, k = [], 0
    for i, part in enumerate(parts):
        k += bool(part)
        title = "fusebot.patch" if n == 1 else f"fusebot.patch, part {k} of {n} (fusebot-{k}.patch)"
        block = f"<details><summary>{title}</summary>\n\n```diff\n{part}```\n\n</details>\n" if part else ""
        text = first + block if i == 0 else f"{marker('fork', f'pr-{plan.source_pr or 0}-part-{k}')}\n{block}"
        out.append(clip(text, limit, keep_paths=True))
    return out


def explain_comments(job_id: str, results: list[TargetResult], limit: int = BODY_LIMIT) -> list[str]:
    """`/fusebot explain`: every target's whole search trace, in as many comments as it takes."""
    head = f"**fusebot search trace** (job `{job_id[:12]}`)\n\n"
    blocks = [f"### {r.class_name or r.target}\n\n{r.trace_markdown or 'no trace recorded'}" for r in results]
    out, current = [], head
    for block in blocks or ["no targets"]:
        while block:
            room = limit - len(current) - 2
            if len(block) <= room:
                current += block + "\n\n"
                block = ""
            else:
                cut = block.rfind("\n", 0, room)
                cut = cut if cut > 0 else room
                if cut <= 0 or room < 200:
                    out.append(current)
                    current = head
                    continue
                current += block[:cut]
                block = block[cut:]
                out.append(current)
                current = head + "*(continued)*\n\n"
    out.append(current)
    return [clip(text, limit) for text in out]
