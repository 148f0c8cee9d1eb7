"""The builtin strategy catalog: a proposer that needs no LLM.

It captures the reference (runner.capture, in a confined child process), recognises its pattern family
(runner.catalog.lower), and proposes the family's strategies (runner.catalog.space) in plain words; each idea is
implemented as distinct parameterisations of a CUDA-C or C++ template (runner.catalog.cuda / cpu), or, for a GEMM or
convolution with an epilogue, as a KernelBench-format candidate (runner.catalog.epilogue). Later rounds refine
around the fastest verified kernel (one parameter changed at a time) before trying strategies not yet tried.
Deterministic: no randomness; nothing already tried is proposed again.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import fields, replace

from runner.capture import capture_source
from runner.catalog import cpu, cuda, epilogue
from runner.catalog.cgen import NotExpressible
from runner.catalog.lower import Pattern, recognise
from runner.catalog.space import Strategy, strategies
from runner.contract import Candidate, Verdict
from runner.proposer import History, Idea, ProblemContext, Session

log = logging.getLogger(__name__)

MARK = "fusebot catalog: "
CHUNK = 2  # parameter sets per idea beyond the first of a strategy (the search's default implementations per idea)

_PATTERNS: dict[str, Pattern] = {}  # sha256 of a reference's source -> its pattern (a capture costs seconds)


def _key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def remember(source: str, pattern: Pattern) -> None:
    """Record a reference's pattern (captured elsewhere, e.g. several at once by runner.capture.capture_sources)."""
    _PATTERNS[_key(source)] = pattern


def label_of(c: Candidate) -> str | None:
    """The parameter label a catalog candidate carries in its first line."""
    for text in c.sources.values():
        first = text.split("\n", 1)[0]
        if MARK in first:
            return first.split(MARK, 1)[1].strip()
    return None


def _neighbours(p) -> list:
    """Parameter sets one step away from p: the 'explore around the best' move."""
    out = []
    if isinstance(p, cuda.CudaParams):
        steps = {"vec": [1, 2, 4, 8], "threads": [128, 256, 512, 1024], "slices": [1, 2, 4, 8, 16, 32, 64, 128],
                 "col_width": [32, 64]}
        if p.layout in ("flat", "bcast"):
            steps["unroll"] = [1, 2, 4, 8]
        for f in fields(p):
            v = getattr(p, f.name)
            if f.name in steps:
                seq = steps[f.name]
                if v in seq:
                    k = seq.index(v)
                    out += [replace(p, **{f.name: seq[j]}) for j in (k - 1, k + 1) if 0 <= j < len(seq)]
        out.append(replace(p, mode="twopass" if p.mode == "online" else "online"))
        out.append(replace(p, fast_math=not p.fast_math))
        if p.layout == "rows":
            out.append(replace(p, group=0 if p.group == 32 else 32))
        if p.layout in ("flat", "bcast"):
            out.append(replace(p, grid="once" if p.grid == "stride" else "stride"))
        if p.layout == "columns":
            out = [replace(x, threads=x.col_width * x.slices) for x in out]
    else:
        out.append(replace(p, threads="all" if p.threads == "one" else "one"))
        out.append(replace(p, mode="twopass" if p.mode == "online" else "online"))
        out.append(replace(p, fast_math=not p.fast_math))
        if p.layout in ("rows", "columns"):
            out.append(replace(p, layout="columns" if p.layout == "rows" else "rows"))
    return out


class CatalogProposer:
    name = "catalog"

    def __init__(self) -> None:
        self.session: Session | None = None
        self._patterns: dict[str, Pattern] = {}
        self._ideas: dict[str, list] = {}  # idea text -> parameter sets, in order
        self._by_label: dict[str, object] = {}
        self._issued: set[str] = set()  # labels implemented since the last ideas() call (one round)

    def bind(self, session: Session) -> None:
        self.session = session

    # ---- the pattern ---------------------------------------------------------------------------------------------
    def pattern(self, ctx: ProblemContext) -> Pattern:
        key = _key(ctx.reference_source)
        if key not in self._patterns:
            pat = _PATTERNS.get(key) or recognise(capture_source(ctx.reference_source))
            _PATTERNS[key] = pat
            if pat.family == "unsupported":
                log.warning("catalog: %s is not a pattern the catalog knows: %s", ctx.name, pat.reason)
            else:
                log.info("catalog: %s is %s (%s)", ctx.name, pat.family, "; ".join(pat.notes))
            self._patterns[key] = pat
        return self._patterns[key]

    def strategies(self, ctx: ProblemContext) -> list[Strategy]:
        pat = self.pattern(ctx)
        if pat.program is None:
            return []
        out = strategies(pat.program, ctx.backend)
        for s in out:
            for p in s.params:
                self._by_label.setdefault(p.label(), p)
        return out

    # ---- the protocol --------------------------------------------------------------------------------------------
    def ideas(self, ctx: ProblemContext, history: History, n: int) -> list[Idea]:
        strats = self.strategies(ctx)
        if not strats:
            return []
        self._issued = set()
        tried = self._tried(history)
        pat = self.pattern(ctx)
        lead = f"[{pat.family}: {'; '.join(pat.notes[:3])}] " if pat.notes else f"[{pat.family}] "
        out: list[Idea] = []
        best = history.best()
        best_label = label_of(best.candidate) if best and best.candidate else None
        if best_label and best_label in self._by_label:
            near = [p for p in _neighbours(self._by_label[best_label]) if p.label() not in tried]
            near = [p for p in dict.fromkeys(near) if self._expressible(ctx, p)]
            for p in near:
                self._by_label.setdefault(p.label(), p)
            if near:
                text = (f"{lead}Refine the fastest kernel so far ({best_label}, {best.median_ms:.4g} ms): the same "
                        f"template one step away in one parameter at a time ({', '.join(p.label() for p in near[:4])}"
                        f"{', ...' if len(near) > 4 else ''}).")
                out.append(self._register(text, near))
        lefts = [(s, [p for p in s.params if p.label() not in tried]) for s in strats]
        for s, left in lefts:
            if left:
                out.append(self._register(lead + s.text, left))
            if len(out) >= n:
                break
        # few strategies (a reduction over a middle dim has one): more of a strategy's parameter sets as their own
        # ideas, CHUNK at a time, so a round still explores as widely as it was asked to
        for s, left in lefts:
            for k in range(CHUNK, len(left), CHUNK):
                if len(out) >= n:
                    return out
                rest = left[k:]
                text = f"{lead}{s.text} Variants: {', '.join(p.label() for p in rest[:CHUNK])}."
                out.append(self._register(text, rest))
        return out[:n]

    def implement(self, ctx: ProblemContext, idea: Idea, history: History, n: int) -> list[Candidate]:
        params = self._ideas.get(idea.text)
        if params is None:  # an idea from an earlier run (a resumed search): find its strategy again
            self.ideas(ctx, history, 64)
            params = self._ideas.get(idea.text, [])
        tried = self._tried(history) | self._issued  # nor twice in one round (two ideas may share a parameter set)
        pat = self.pattern(ctx)
        out: list[Candidate] = []
        for p in params:
            if len(out) >= n:
                break
            if p.label() in tried:
                continue
            try:
                out.append(self.candidate(ctx, pat, p))
            except NotExpressible as e:
                log.info("catalog: %s cannot express this program: %s", p.label(), e)
            tried.add(p.label())
            self._issued.add(p.label())
        return out

    def repair(self, ctx: ProblemContext, candidate: Candidate, verdict: Verdict) -> Candidate | None:
        return None  # a template either fits or it does not; the search moves on to another parameter set

    # ---- helpers -----------------------------------------------------------------------------------------------
    def _register(self, text: str, params: list) -> Idea:
        self._ideas[text] = params
        return Idea(text=text)

    def _tried(self, history: History) -> set[str]:
        return {lab for a in history.attempts if a.candidate and (lab := label_of(a.candidate))}

    def _expressible(self, ctx: ProblemContext, p) -> bool:
        try:
            self.candidate(ctx, self.pattern(ctx), p)
            return True
        except NotExpressible:
            return False

    def candidate(self, ctx: ProblemContext, pat: Pattern, p) -> Candidate:
        """One concrete candidate: the template rendered with parameters p (raises NotExpressible)."""
        assert pat.program is not None
        mod = cpu if ctx.backend == "cpu" else cuda
        if isinstance(p, cpu.CpuParams) != (ctx.backend == "cpu"):
            raise NotExpressible("parameters of the other backend")
        label = p.label()
        if pat.family == "epilogue":
            assert pat.heavy is not None
            kernel = mod.render(pat.program, p, abi_offset=1)
            src = f"# {MARK}{label}\n" + epilogue.render(pat.program, pat.heavy, kernel, ctx.backend,
                                                                 ctx.reference_source)
            return Candidate(id=label, format="kernelbench", backend=ctx.backend, sources={"candidate.py": src})
        src = mod.render(pat.program, p)
        name = "kernel.cpp" if ctx.backend == "cpu" else "kernel.cu"
        return Candidate(id=label, format="fast", backend=ctx.backend, sources={name: src})


def catalog_proposers() -> list[CatalogProposer]:
    """What `fusebot optimize` uses when no LLM is configured."""
    return [CatalogProposer()]
