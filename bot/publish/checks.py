"""The check run's texts: queued, in progress (the search's progress), completed (success with the tables when a change
is proposed; neutral, with each target's reason, when nothing is; failure when the job itself failed).
"""

from __future__ import annotations

from bot.github.platform import CheckOutput
from bot.publish.body import fit_traces
from bot.publish.plan import PullRequestPlan
from bot.publish.text import clip
from bot.publish.verdicts import environment_line, speedup, target_table, times, verdict_line
from runner.contract import Progress

CHECK_NAME = "fusebot"


def check_queued(targets: list[str]) -> CheckOutput:
    return CheckOutput("queued", "Waiting for a GPU runner",
                       clip(f"{len(targets)} marked target(s) queued: " + ", ".join(f"`{t}`" for t in targets) + "."))


def check_in_progress(p: Progress, rounds: int, target: str = "") -> CheckOutput:
    best = times(p.best_speedup) if p.best_speedup is not None else "none yet"
    what = f" `{target}`:" if target else ""
    summary = (f"Searching{what} round {p.round}/{rounds}; {p.built} candidate(s) built, {p.verified} verified, "
               f"{p.rejected} rejected; best so far {best} over the faster baseline, as the search timed it (the "
               "confirmation's alternating rounds decide the figure a PR states).")
    return CheckOutput("in_progress", f"Round {p.round}/{rounds}: best {best}",
                       clip(summary + (f" {p.message}" if p.message else "")))


def check_completed(plan: PullRequestPlan, pr_url: str | None = None, error: str | None = None) -> CheckOutput:
    """success with the tables when a kernel is proposed; neutral, with each target's reason, when nothing is;
    failure when the job itself failed."""
    if error:
        return CheckOutput("completed", "fusebot could not finish", clip(f"The optimization job failed: {error}"),
                           "failure")
    tables = "\n\n".join(target_table(r) for r in plan.results)
    env = environment_line(plan.environment)
    if not plan.improved:
        why = "\n".join(f"- `{r.class_name or r.target}`: {r.message or 'no verified kernel'}" for r in plan.results)
        summary = (f"{verdict_line(plan.results)}\n\n{why}\n\nNo pull request is opened: a change is proposed only "
                   "when it is verified and faster than both PyTorch eager and torch.compile, in every confirmation "
                   "round and by the minimum effect (the larger of 3% and the rounds' spread).")
        return CheckOutput("completed", "Nothing proposed", clip(summary), "neutral",
                           clip(f"{tables}\n\n{env}"))
    link = f"\n\nProposed in {pr_url}." if pr_url else ""
    title = ", ".join(f"{r.class_name or r.target} {times(speedup(r.verdict))}" for r in plan.improved)
    return CheckOutput("completed", f"Faster: {title}"[:255], clip(f"{verdict_line(plan.results)}{link}\n\n{tables}"),
                       "success", clip(env + "\n\n" + "\n\n".join(fit_traces(env, plan.results))))
