"""What a search found, as data, markdown and JSON: pure functions (the PR bodies build on them).

`outcome()` decides whether the best verified kernel beats the faster of eager and torch.compile; `benchmark_table()`
and `trace_markdown()` render it; `report_markdown()` is report.md and `result_json()` is result.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runner.contract import SCHEMA_VERSION, Baselines, Roofline, Verdict, faster_baseline, table_cell
from runner.contract import benchmark_table as contract_benchmark_table
from runner.search.loop import SearchResult
from runner.search.pool import Credit, credit_markdown
from runner.search.types import Attempt, Idea


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

    @property
    def verdict(self) -> Verdict | None:
        return self.best.verdict if self.best else None


def outcome(problem: str, result: SearchResult, baselines: Baselines | None, roofline: Roofline | None,
            confirmed: Verdict | None = None) -> Outcome:
    """`confirmed`: the best kernel re-verified and re-timed against both baselines in alternating rounds
    (Evaluator.confirm). When given, it decides: the kernel must beat the faster baseline in every round."""
    best = result.best
    if confirmed is not None and best is not None:
        return _confirmed_outcome(problem, result, best, confirmed, roofline)
    fb = faster_baseline(baselines)
    faster, base_ms = (fb[0], fb[1].median_ms) if fb else ("eager", None)
    if best is None or best.median_ms is None:
        improved, message = False, "no candidate was verified: no kernel is proposed"
    elif best.verdict is not None and best.verdict.degenerate:
        improved, message = False, ("the problem is degenerate (its output does not depend on its input): no speedup "
                                    "on it is reportable, no kernel is proposed")
    elif base_ms is not None and best.median_ms >= base_ms:
        improved, message = False, (f"nothing beat {faster} ({base_ms:.4g} ms): the fastest verified kernel took "
                                    f"{best.median_ms:.4g} ms; no kernel is proposed")
    else:
        improved = True
        message = f"{best.median_ms:.4g} ms, {base_ms / best.median_ms:.2f}x faster than {faster} ({base_ms:.4g} ms)" \
            if base_ms else f"{best.median_ms:.4g} ms (no baseline was measured)"
    return Outcome(problem=problem, improved=improved, message=message, best=best, baselines=baselines,
                   roofline=roofline, stop_reason=result.stop_reason, rounds=result.rounds,
                   candidates=result.candidates,
                   tokens_used=result.tokens_used, cost_usd=result.cost_usd, gpu_seconds=result.gpu_seconds,
                   wall_seconds=result.wall_seconds, attempts=list(result.history.attempts),
                   ideas=list(result.history.ideas),
                   credit=list(result.credit))


def _confirmed_outcome(problem: str, result: SearchResult, best: Attempt, v: Verdict,
                       roofline: Roofline | None) -> Outcome:
    if best.verdict is not None:  # the search's trials (every shape and distribution), then the confirmation's
        v = v.model_copy(update={"trials": [*best.verdict.trials, *v.trials]})
    best = best.model_copy(update={"verdict": v})
    c = v.confirmation
    if not v.accepted or c is None or v.timing is None:
        improved = False
        message = "the fastest kernel failed when verified again: " + "; ".join(v.reasons[:2])
    elif v.degenerate:
        improved, message = False, ("the problem is degenerate (its output does not depend on its input): no speedup "
                                    "on it is reportable, no kernel is proposed")
    else:
        per_round = c.speedup_vs_faster()
        faster, base = faster_baseline(v.baselines)
        base_ms = base.median_ms
        spread = f"{min(per_round):.2f}-{max(per_round):.2f}x over {c.rounds} alternating rounds"
        improved = min(per_round) > 1.0
        if improved:
            message = (f"{v.timing.median_ms:.4g} ms, {base_ms / v.timing.median_ms:.2f}x faster than {faster} "
                       f"({base_ms:.4g} ms; {spread})")
        else:
            message = (f"nothing beat {faster} in every round: the fastest verified kernel took "
                       f"{v.timing.median_ms:.4g} ms against {base_ms:.4g} ms ({spread}); no kernel is proposed")
    return Outcome(problem=problem, improved=improved, message=message, best=best, baselines=v.baselines,
                   roofline=roofline or v.roofline, stop_reason=result.stop_reason, rounds=result.rounds,
                   candidates=result.candidates, tokens_used=result.tokens_used, cost_usd=result.cost_usd,
                   gpu_seconds=result.gpu_seconds, wall_seconds=result.wall_seconds,
                   attempts=list(result.history.attempts), ideas=list(result.history.ideas),
                   credit=list(result.credit))


def benchmark_table(o: Outcome) -> str:
    label = f"fusebot ({o.best.candidate.id if o.best and o.best.candidate else 'best'})"
    return contract_benchmark_table(o.baselines, o.verdict.timing if o.verdict else None, o.roofline, label)


def _verdict_text(a: Attempt) -> str:
    if a.candidate is None:
        return "no candidate"
    if a.accepted and a.median_ms is not None:
        return f"verified, {a.median_ms:.4g} ms"
    return f"rejected at {a.verdict.stage}" if a.verdict else "not evaluated"


def trace_markdown(o: Outcome) -> str:
    """The search trace: per round, the ideas, then every attempt with its verdict and reasons."""
    out = []
    for rnd in sorted({i.round for i in o.ideas} | {a.round for a in o.attempts}):
        out.append(f"### Round {rnd}")
        ideas = [i for i in o.ideas if i.round == rnd]
        if ideas:
            out.append("Ideas:\n" + "\n".join(f"- ({table_cell(i.proposer, 40)}) {table_cell(i.text, 400)}" for i in ideas))
        rows = [a for a in o.attempts if a.round == rnd]
        if rows:
            out.append("| candidate | idea | verdict | reasons |\n| --- | --- | --- | --- |")
            for a in rows:
                name = (a.candidate.id if a.candidate else "-") + (" (repair)" if a.repair_of else "")
                why = "" if a.accepted else table_cell("; ".join(a.reasons), 200)
                out[-1] += f"\n| {name} | {table_cell(a.idea, 80)} | {_verdict_text(a)} | {why} |"
    return "\n\n".join(out)


def report_markdown(o: Outcome) -> str:
    v = o.verdict
    head = [f"# fusebot: {o.problem}", "", ("**Improved**: " if o.improved else "**No improvement**: ") + o.message, ""]
    if v and v.warnings:
        head += [f"> {table_cell(w, 600)}" for w in v.warnings] + [""]
    head += ["## Benchmark", "", benchmark_table(o), ""]
    if v and v.environment:
        e = v.environment
        how = "; ".join(x for x in (v.timing.call_text(), v.timing.lead_text()) if x) if v.timing else ""
        head += [f"Measured on {e.gpu or e.cpu or e.device} (torch {e.torch}, CUDA {e.cuda or 'n/a'}, "
                 f"fusebot {e.fusebot}); times are medians of n calls, spread as IQR" + (f"; {how}." if how else "."),
                 ""]
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
        "message": o.message,
        "verdict": o.verdict.model_dump() if o.verdict else None,
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
