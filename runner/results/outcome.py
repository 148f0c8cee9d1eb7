"""What a search found, as data, markdown and JSON: pure functions (the PR bodies build on them).

`outcome()` decides what is proposed: the best verified kernel or PyTorch rewrite (runner/results/choice.py), when its
confirmation beat the faster of eager and torch.compile in every round and by the minimum effect; `benchmark_table()`
and `trace_markdown()` render it; `report_markdown()` is report.md and `result_json()` is result.json.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from runner.contract import CUT_OFF, SCHEMA_VERSION, Baselines, Roofline, Timing, Verdict, faster_baseline, table_cell
from runner.contract import benchmark_table as contract_benchmark_table
from runner.results.choice import DEGENERATE, KERNEL, REWRITE, REWRITE_LABEL, choose, claim, finalists, is_rewrite
from runner.results.proposal import Fallback
from runner.search.loop import SearchResult
from runner.search.pool import Credit, credit_markdown
from runner.search.types import Attempt, Idea

REASON_CHARS = 240  # of a rejection's reason quoted where no candidate was verified


@dataclass
class Outcome:
    problem: str
    improved: bool
    message: str
    best: Attempt | None  # the fastest verified kernel, whether or not it beat the baselines
    baselines: Baselines | None
    roofline: Roofline | None
    stop_reason: str = ""
    rounds: int = 0
    candidates: int = 0
    tokens_used: int = 0
    cost_usd: float = 0.0
    gpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    attempts: list[Attempt] = field(default_factory=list)
    ideas: list[Idea] = field(default_factory=list)
    credit: list[Credit] = field(default_factory=list)  # per proposer
    change: str = KERNEL  # what `best` is: "kernel" (a kernel and its drop-in) or "rewrite" (a new module source)
    margin: float | None = None  # the minimum effect the claim was held to (0.03: 3% over the faster baseline)
    rewrite: Attempt | None = None  # the best verified PyTorch rewrite (shown in every table), whichever is proposed
    choice: str = ""  # why the kernel and not the rewrite, or the other way round ("" with no rewrite)
    fallback: Fallback | None = None  # the eligible rewrite's claim when the kernel was chosen over it
    speed: str = ""  # the speed verdict apart from correctness (a key of choice.SPEED; "" with nothing verified)

    @property
    def verdict(self) -> Verdict | None:
        return self.best.verdict if self.best else None


def outcome(problem: str, result: SearchResult, baselines: Baselines | None, roofline: Roofline | None,
            confirmed: Verdict | None = None, confirmed_rewrite: Verdict | None = None) -> Outcome:
    """`confirmed`, `confirmed_rewrite`: the best kernel and the best PyTorch rewrite re-verified and re-timed against
    both baselines in alternating rounds (choice.confirm_finalists). When given, they decide (choice.claim, choose)."""
    kernel, rewrite = finalists(result)
    stats = dict(stop_reason=result.stop_reason, rounds=result.rounds, candidates=result.candidates,
                 tokens_used=result.tokens_used, cost_usd=result.cost_usd, gpu_seconds=result.gpu_seconds,
                 wall_seconds=result.wall_seconds, attempts=list(result.history.attempts),
                 ideas=list(result.history.ideas), credit=list(result.credit))
    k = claim(kernel, confirmed) if kernel is not None and confirmed is not None else None
    w = claim(rewrite, confirmed_rewrite) if rewrite is not None and confirmed_rewrite is not None else None
    if k is not None or w is not None:
        chosen, why = choose(k, w)
        v = chosen.attempt.verdict
        fallback = Fallback(w.message, w.margin) if w is not None and w.eligible and chosen is not w else None
        return Outcome(problem=problem, improved=chosen.eligible, message=chosen.message, best=chosen.attempt,
                       baselines=v.baselines if v else baselines, roofline=roofline or (v.roofline if v else None),
                       change=chosen.kind, margin=chosen.margin, rewrite=w.attempt if w else rewrite, choice=why,
                       speed=chosen.speed, fallback=fallback, **stats)
    best = result.best
    fb = faster_baseline(baselines)
    faster, base_ms = (fb[0], fb[1].median_ms) if fb else ("eager", None)
    speed = ""
    if best is None or best.median_ms is None:
        cut = sum(1 for a in result.history.attempts if CUT_OFF in a.reasons)
        improved, message = False, (f"the budget ran out before any candidate was verified ({cut} cut off during "
                                    "their evaluation): no kernel is proposed; a larger budget gives the search time"
                                    if cut else f"no candidate was verified ({why_none(result.history.attempts)}): "
                                                "no kernel is proposed")
    elif best.verdict is not None and best.verdict.degenerate:
        improved, message, speed = False, DEGENERATE, "degenerate"
    elif base_ms is not None and best.median_ms >= base_ms:
        improved, message, speed = False, (f"nothing beat {faster} ({base_ms:.4g} ms): the fastest verified kernel "
                                           f"took {best.median_ms:.4g} ms; no kernel is proposed"), "not faster"
    else:
        improved, speed = True, "faster"
        message = f"{best.median_ms:.4g} ms, {base_ms / best.median_ms:.2f}x faster than {faster} ({base_ms:.4g} ms)" \
            if base_ms else f"{best.median_ms:.4g} ms (no baseline was measured)"
    return Outcome(problem=problem, improved=improved, message=message, best=best, baselines=baselines,
                   roofline=roofline, change=REWRITE if best is not None and is_rewrite(best.candidate) else KERNEL,
                   rewrite=rewrite if rewrite is not best else None, speed=speed, **stats)


def why_none(attempts: list[Attempt]) -> str:
    """What became of the candidates where none was verified: how many, by the first word of their first reason,
    and the most common reason in full (shortened), so that the user sees the cause and not only the count."""
    if not attempts:
        return "none was evaluated"
    reasons = [a.reasons[0] if a.reasons else "no verdict" for a in attempts]
    kinds = Counter(r.split(":", 1)[0].strip() for r in reasons)
    top = kinds.most_common(1)[0][0]
    example = next(r for r in reasons if r.split(":", 1)[0].strip() == top)
    example = " ".join(example.split())
    if len(example) > REASON_CHARS:
        example = example[:REASON_CHARS - 1] + "…"
    counts = ", ".join(f"{n} {k}" for k, n in kinds.most_common())
    return f"{len(attempts)} evaluated: {counts}; {'the first' if kinds[top] == 1 else 'one'}: {example}"


def proposal(o: Outcome) -> dict[str, Any]:
    """What the result's files say beyond the verdict (runner.results.files.target_result's keywords): which change,
    why, the margin, the PyTorch rewrite's attempt, and its claim when it is the fallback."""
    return {"change": o.change, "choice": o.choice, "margin": o.margin, "rewrite": o.rewrite, "fallback": o.fallback}


def rewrite_timing(o: Outcome) -> Timing | None:
    """The PyTorch rewrite's timing when one was verified and is not itself the proposed change's row."""
    if o.rewrite is None or o.rewrite is o.best or o.rewrite.verdict is None:
        return None
    return o.rewrite.verdict.timing


def with_row(table: str, baselines: Baselines | None, roofline: Roofline | None, label: str,
             timing: Timing | None) -> str:
    """`table` (contract.benchmark_table) with one more contestant's row before the roofline floor's."""
    if timing is None:
        return table
    row = next(line for line in contract_benchmark_table(baselines, timing, roofline, label).splitlines()
               if line.startswith(f"| {label} |"))
    lines = table.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("| roofline floor |")), len(lines))
    return "\n".join([*lines[:at], row, *lines[at:]])


def benchmark_table(o: Outcome) -> str:
    """Eager, torch.compile, the proposed change (or the fastest verified), the PyTorch rewrite when one was verified
    and is not that change, and the roofline floor."""
    what = REWRITE_LABEL if o.change == REWRITE else "fusebot"
    label = f"{what} ({o.best.candidate.id if o.best and o.best.candidate else 'best'})"
    table = contract_benchmark_table(o.baselines, o.verdict.timing if o.verdict else None, o.roofline, label)
    return with_row(table, o.baselines, o.roofline, REWRITE_LABEL, rewrite_timing(o))


def _verdict_text(a: Attempt) -> str:
    if a.candidate is None:
        return "no candidate"
    kind = "rewrite, " if is_rewrite(a.candidate) else ""
    if a.accepted and a.median_ms is not None:
        return f"{kind}verified, {a.median_ms:.4g} ms"
    return f"{kind}rejected at {a.verdict.stage}" if a.verdict else "not evaluated"


def why_text(a: Attempt, o: Outcome) -> str:
    """The trace's "why" cell: a rejection's reasons; for a verified candidate, how it stood against the faster
    baseline and the fastest one; never empty."""
    if a.candidate is None:
        return a.failure or "the answer held no usable code"
    if not a.accepted:
        if CUT_OFF in a.reasons:  # its process was killed when the budget ran out: that, not how it died, is why
            return CUT_OFF
        if a.reasons:
            return "; ".join(a.reasons)
        return "verified but not timed" if a.verdict is not None and a.verdict.accepted else \
            f"rejected at {a.verdict.stage if a.verdict else 'evaluation'} (no reason recorded)"
    fb = faster_baseline(o.baselines)
    parts = [f"{fb[1].median_ms / a.median_ms:.2f}x over {fb[0]}"] if fb and a.median_ms else []
    best = o.best.candidate.id if o.best and o.best.candidate else None
    fastest = min((x.median_ms for x in o.attempts if x.accepted and x.median_ms), default=None)
    if best == a.candidate.id:
        parts.append("proposed" if o.improved else "the finalist (not proposed: see above)")
    elif o.rewrite is not None and o.rewrite.candidate and o.rewrite.candidate.id == a.candidate.id:
        parts.append("the best PyTorch rewrite")
    elif fastest and a.median_ms and a.median_ms > fastest:
        parts.append(f"{100 * (a.median_ms / fastest - 1):.0f}% slower than the fastest")
    return "; ".join(parts + hardware_parts(a, o.roofline)) or "verified"


def hardware_parts(a: Attempt, roofline: Roofline | None) -> list[str]:
    """A verified candidate's place against the memory floor and what ptxas reported of its kernels (registers,
    spills, shared memory): the trace's row says them as the next round's prompt does."""
    out = []
    if roofline is not None and roofline.floor_ms > 0 and a.median_ms:
        out.append(f"{100 * roofline.floor_ms / a.median_ms:.0f}% of the floor")
    build = a.verdict.build if a.verdict else None
    if build is not None and build.kernels:
        out.append(f"ptxas: {build.kernels_text()}")
    return out


def trace_markdown(o: Outcome) -> str:
    """The search trace: per round, the ideas, then every attempt with its verdict and why (never empty)."""
    out = []
    for rnd in sorted({i.round for i in o.ideas} | {a.round for a in o.attempts}):
        out.append(f"### Round {rnd}")
        ideas = [i for i in o.ideas if i.round == rnd]
        if ideas:
            out.append("Ideas:\n" + "\n".join(f"- ({table_cell(i.proposer, 40)}) {table_cell(i.text, 400)}" for i in ideas))
        rows = [a for a in o.attempts if a.round == rnd]
        if rows:
            out.append("| candidate | idea | verdict | why |\n| --- | --- | --- | --- |")
            for a in rows:
                name = (a.candidate.id if a.candidate else "-") + (" (repair)" if a.repair_of else "")
                out[-1] += (f"\n| {name} | {table_cell(a.idea, 80)} | {_verdict_text(a)} | "
                            f"{table_cell(why_text(a, o), 400)} |")
    return "\n\n".join(out)


def report_markdown(o: Outcome) -> str:
    v = o.verdict
    head = [f"# fusebot: {o.problem}", "", ("**Improved**: " if o.improved else "**No improvement**: ") + o.message, ""]
    if o.choice:
        head += [f"Proposed change: {'a PyTorch rewrite of the module' if o.change == REWRITE else 'a kernel'}: "
                 f"{o.choice}.", ""]
    if v and v.warnings:
        head += [f"> {table_cell(w, 600)}" for w in v.warnings] + [""]
    head += ["## Benchmark", "", benchmark_table(o), ""]
    if v and v.environment:
        e = v.environment
        how = "; ".join(x for x in (v.timing.call_text(), v.timing.lead_text()) if x) if v.timing else ""
        head += [f"Measured on {e.gpu or e.cpu or e.device} (torch {e.torch}, CUDA {e.cuda or 'n/a'}, "
                 f"fusebot {e.fusebot}); times are medians of n calls, spread as IQR" + (f"; {how}." if how else "."),
                 ""]
    if v and v.build and v.build.kernels:
        head += [f"Compiled (ptxas): {v.build.kernels_text()}.", ""]
    cost = f", ${o.cost_usd:.2f}" if o.cost_usd else ""
    head += ["## Search", "",
             f"{o.rounds} round(s), {o.candidates} candidate(s) evaluated, {o.tokens_used} tokens{cost}, "
             f"{o.gpu_seconds:.1f} s in the harness, {o.wall_seconds:.1f} s in all; stopped: {o.stop_reason}.", "",
             *([credit_markdown(o.credit), ""] if o.credit else []), trace_markdown(o), ""]
    return "\n".join(head)


def result_json(o: Outcome, files: list[str] | None = None) -> dict[str, Any]:
    accepted = sum(1 for a in o.attempts if a.accepted)
    return {
        "schema_version": SCHEMA_VERSION,
        "problem": o.problem,
        "improved": o.improved,
        "speed": o.speed,
        "message": o.message,
        "change": o.change,
        "margin": o.margin,
        "choice": o.choice,
        "verdict": o.verdict.model_dump() if o.verdict else None,
        "rewrite_verdict": o.rewrite.verdict.model_dump() if o.rewrite and o.rewrite.verdict else None,
        "baselines": o.baselines.model_dump() if o.baselines else None,
        "roofline": o.roofline.model_dump() if o.roofline else None,
        "files": list(files or []),
        "trace_summary": {
            "stop_reason": o.stop_reason, "rounds": o.rounds, "candidates": o.candidates,
            "attempts": len(o.attempts), "accepted": accepted,
            "rejected": sum(1 for a in o.attempts if a.candidate is not None and not a.accepted),
            "no_code": sum(1 for a in o.attempts if a.candidate is None),
            "ideas": len(o.ideas), "tokens_used": o.tokens_used, "cost_usd": o.cost_usd,
            "gpu_seconds": o.gpu_seconds, "wall_seconds": o.wall_seconds,
            "best": o.best.candidate.id if o.best and o.best.candidate else None,
            "credit": [c.as_dict() for c in o.credit],
        },
    }
