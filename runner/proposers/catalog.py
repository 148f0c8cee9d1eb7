"""The builtin strategy catalog: a proposer that needs no LLM.

It captures the reference (runner.catalog.capture, in a confined child process), recognises its pattern family
(runner.catalog.recognition), and proposes the family's strategies (runner.catalog.space) in plain words; each idea is
implemented as distinct parameterisations of a CUDA-C or C++ template (runner.catalog.codegen.cuda / cpu), or, for a GEMM or
convolution with an epilogue, as a KernelBench-format candidate (runner.catalog.epilogue). Later rounds refine
around the fastest verified kernel (one parameter changed at a time) before trying strategies not yet tried.
Deterministic: no randomness; nothing already tried is proposed again.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import fields, replace

from runner.catalog import epilogue
from runner.catalog.codegen import cpu, cuda
from runner.catalog.codegen.common import NotExpressible
from runner.catalog.codegen.head import MATH
from runner.catalog.codegen.used import ACC_STRUCTS
from runner.catalog.pattern import Pattern
from runner.catalog.recognition import recognise
from runner.catalog.space import Strategy, strategies
from runner.contract import Candidate, Verdict
from runner.proposers.capture_cache import cached_capture
from runner.search.types import History, Idea, ProblemContext, Session

log = logging.getLogger(__name__)

MARK = "fusebot catalog: "
CHUNK = 2  # parameter sets per idea beyond the first of a strategy (the search's default implementations per idea)

_PATTERNS: dict[str, Pattern] = {}  # sha256 of a reference's source -> its pattern (a capture costs seconds)


def _key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def remember(source: str, pattern: Pattern) -> None:
    """Record a reference's pattern (captured elsewhere, e.g. several at once by runner.catalog.capture.capture_sources)."""
    _PATTERNS[_key(source)] = pattern


def label_of(c: Candidate) -> str | None:
    """The parameter label a catalog candidate carries in its first line."""
    for text in c.sources.values():
        first = text.split("\n", 1)[0]
        if MARK in first:
            return first.split(MARK, 1)[1].strip()
    return None


# fast math only changes these (cgen.MATH); nvcc and g++ get no fast-math flag
_FAST_CALLS = ("fb_exp(", "fb_div(", "fb_log(", "fb_tanh(", "fb_sigmoid(", "AccLse")


def _unused_fast_math_dropped(text: str) -> str:
    """The source without its fast-math defines when nothing in it calls what they change (a ReLU, a sum, a batch
    norm's affine): the fast variant is then the same machine code. Also inside a ModelNew's repr()'d kernel."""
    for block in (cuda.FAST, cpu.FAST):
        for quote in (lambda t: t, lambda t: repr(t)[1:-1]):  # the templates join their parts with newlines
            b = quote(block + "\n")
            if b in text:
                body = text.replace(b, "").replace(quote(MATH), "")
                for acc in ACC_STRUCTS.values():  # a source holds the accumulators it uses (AccLse is in _FAST_CALLS)
                    body = body.replace(quote(acc), "")
                return text if any(call in body for call in _FAST_CALLS) else text.replace(b, "")
    return text


def code_key(c: Candidate) -> str:
    """What a candidate's code is, its label left out: parameter sets that render the same code (the online/two-pass
    switch of a plain sum, fast math where nothing uses it) are one
    candidate, measured once."""
    lab = label_of(c)
    h = hashlib.sha256()
    for name in sorted(c.sources):
        text = _unused_fast_math_dropped(c.sources[name].replace(lab, "") if lab else c.sources[name])
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()


SMEM_BYTES = 227 * 1024  # dynamic shared memory one sm_90 block may have: the cluster template's limit


def fits(p, prog) -> bool:
    """False for a parameter set the template would refuse at run time on the captured shapes (a cluster slice of
    the row larger than a block's shared memory): proposing it would spend a build and a trial on an error."""
    if isinstance(p, cuda.CudaParams) and p.layout in ("cluster", "grid") and prog is not None and prog.is_row:
        _, R, _ = prog.split()
        width = {"float16": 2, "bfloat16": 2, "float64": 8, "int64": 8}
        per_elem = sum(width.get(i.dtype, 4) for k, i in enumerate(prog.inputs) if prog.access(k) == "full")
        return R * per_elem / max(p.slices, 1) <= SMEM_BYTES - 1024
    return True


def effective(p, prog):
    """The parameter set that runs on the captured shapes: the rows, split, cluster and grid templates take their
    vector path only when a row's length is a multiple of the width (level1 38/39: rows of 65535), the columns template
    only when the inner dim is, else their scalar kernels, so a wider parameter set would be measured as a scalar one
    under another name."""
    if isinstance(p, cuda.CudaParams) and p.vec > 1 and p.layout in ("rows", "split", "cluster", "grid") \
            and prog is not None \
            and prog.is_row:
        _, R, inner = prog.split()
        if inner == 1 and R % p.vec:
            return replace(p, vec=1, chunks=1)  # (the scalar kernel's fill is not cut in parts)
        runs = [prog.block_len(k) for k in cuda.rowblock_inputs(prog)]
        if any(n > 1 and n % p.vec for n in runs):  # a rowblock input's runs (a GroupNorm channel) not whole vectors
            return replace(p, vec=1, chunks=1)
    if isinstance(p, cuda.CudaParams) and p.vec > 1 and p.layout == "columns" and prog is not None and prog.is_row:
        _, _, inner = prog.split()
        if inner % p.vec:  # (inner == 1 too: a reduction over the innermost dims runs the scalar columns kernel)
            return replace(p, vec=1)
    return p


def _neighbours(p) -> list:
    """Parameter sets one step away from p: the 'explore around the best' move."""
    out = []
    if isinstance(p, cuda.CudaParams):
        steps = {"vec": [1, 2, 4, 8], "threads": [128, 256, 512, 1024], "slices": [1, 2, 4, 8, 16, 32, 64, 128],
                 "col_width": [32, 64]}
        if p.layout in ("flat", "bcast", "split", "columns", "strided"):
            steps["unroll"] = [1, 2, 4, 8]
        if p.layout == "strided":
            steps["vec"] = [2, 4, 8]  # (a width of one is the columns layout's scalar kernel)
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
        if p.layout in ("cluster", "regs"):
            out.append(replace(p, buffers=3 - p.buffers))
        if p.layout == "split":
            out.append(replace(p, interleave=not p.interleave))
        if p.layout in ("grid", "cluster") and p.buffers == 1 and p.vec > 1:  # the first pass in 1, 2, 4, 8 parts
            seq = [1, 2, 4, 8]
            k = seq.index(p.chunks) if p.chunks in seq else 0
            out += [replace(p, chunks=seq[j]) for j in (k - 1, k + 1) if 0 <= j < len(seq)]
        if p.layout in ("grid", "cluster"):  # parts only with one buffer and whole vectors
            out = [x for x in out if x.chunks == 1 or (x.buffers == 1 and x.vec > 1)]
        if p.layout == "grid":  # at least two blocks per row
            out = [x for x in out if x.slices >= 2]
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
        self._issued_codes: set[str] = set()  # and their code keys
        self._rendered: dict[tuple[str, str, str], Candidate | None] = {}  # (source key, backend, label) -> candidate

    def bind(self, session: Session) -> None:
        self.session = session

    # ---- the pattern ---------------------------------------------------------------------------------------------
    def pattern(self, ctx: ProblemContext) -> Pattern:
        key = _key(ctx.reference_source)
        if key not in self._patterns:
            pat = _PATTERNS.get(key) or recognise(cached_capture(ctx.reference_source))
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
        out = [replace(s, params=list(dict.fromkeys(effective(p, pat.program) for p in s.params)))
               for s in strategies(pat.program, ctx.backend)]
        for s in out:
            for p in s.params:
                self._by_label.setdefault(p.label(), p)
        return out

    # ---- the protocol --------------------------------------------------------------------------------------------
    def ideas(self, ctx: ProblemContext, history: History, n: int) -> list[Idea]:
        strats = self.strategies(ctx)
        if not strats:
            return []
        self._issued, self._issued_codes = set(), set()
        tried = self._tried(history)
        codes = self._tried_codes(history)
        pat = self.pattern(ctx)
        lead = f"[{pat.family}: {'; '.join(pat.notes[:3])}] " if pat.notes else f"[{pat.family}] "
        out: list[Idea] = []
        best = history.best()
        best_label = label_of(best.candidate) if best and best.candidate else None
        if best_label and best_label in self._by_label:
            near = [effective(p, pat.program) for p in _neighbours(self._by_label[best_label])]
            near = [p for p in near if p.label() not in tried]
            near = [p for p in dict.fromkeys(near) if self._fresh(ctx, p, codes)]
            for p in near:
                self._by_label.setdefault(p.label(), p)
            if near:
                text = (f"{lead}Refine the fastest kernel so far ({best_label}, {best.median_ms:.4g} ms): the same "
                        f"template one step away in one parameter at a time ({', '.join(p.label() for p in near[:4])}"
                        f"{', ...' if len(near) > 4 else ''}).")
                out.append(self._register(text, near))
        lefts = [(s, [p for p in s.params if p.label() not in tried and self._fresh(ctx, p, codes)]) for s in strats]
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
        codes = self._tried_codes(history) | self._issued_codes
        out: list[Candidate] = []
        for p in params:
            if len(out) >= n:
                break
            if p.label() in tried:
                continue
            tried.add(p.label())
            self._issued.add(p.label())
            c = self._render(ctx, p)
            if c is None or not fits(p, self.pattern(ctx).program):
                continue
            key = code_key(c)
            if key in codes:
                log.info("catalog: %s renders the same code as a candidate already tried", p.label())
                continue
            codes.add(key)
            self._issued_codes.add(key)
            out.append(c)
        return out

    def repair(self, ctx: ProblemContext, candidate: Candidate, verdict: Verdict) -> Candidate | None:
        return None  # a template either fits or it does not; the search moves on to another parameter set

    # ---- helpers -----------------------------------------------------------------------------------------------
    def _register(self, text: str, params: list) -> Idea:
        self._ideas[text] = params
        return Idea(text=text)

    def _tried(self, history: History) -> set[str]:
        return {lab for a in history.attempts if a.candidate and (lab := label_of(a.candidate))}

    def _tried_codes(self, history: History) -> set[str]:
        return {code_key(a.candidate) for a in history.attempts if a.candidate and label_of(a.candidate)}

    def _render(self, ctx: ProblemContext, p) -> Candidate | None:
        """The candidate of parameter set p (None when the template cannot express the program), rendered once."""
        key = (_key(ctx.reference_source), ctx.backend, p.label())
        if key not in self._rendered:
            try:
                self._rendered[key] = self.candidate(ctx, self.pattern(ctx), p)
            except NotExpressible as e:
                log.info("catalog: %s cannot express this program: %s", p.label(), e)
                self._rendered[key] = None
        return self._rendered[key]

    def _fresh(self, ctx: ProblemContext, p, codes: set[str]) -> bool:
        """p renders, fits the captured shapes, and its code is not one already tried."""
        c = self._render(ctx, p)
        return c is not None and fits(p, self.pattern(ctx).program) and code_key(c) not in codes

    def candidate(self, ctx: ProblemContext, pat: Pattern, p) -> Candidate:
        """One concrete candidate: the template rendered with parameters p (raises NotExpressible)."""
        assert pat.program is not None
        mod = cpu if ctx.backend == "cpu" else cuda
        if isinstance(p, cpu.CpuParams) != (ctx.backend == "cpu"):
            raise NotExpressible("parameters of the other backend")
        label = p.label()
        if pat.family == "graph" and _whole_rope(pat, p):  # every output by one rope kernel (runner.catalog.rope)
            src = mod.render(pat.program, p)
            return Candidate(id=label, format="fast", backend=ctx.backend, sources={"kernel.cu": src})
        if pat.family == "graph":
            kernels = {}
            for j, st in enumerate(pat.plan.stages):
                if st.kind != "fused":
                    continue
                prog, _ = epilogue.stage_program(st.pattern.program)
                try:
                    kernels[j] = mod.render(prog, p)
                except NotExpressible:  # another layout than the tuned stage's: that program's own first choice
                    first = strategies(st.pattern.program, ctx.backend)[0].params[0]
                    kernels[j] = mod.render(prog, first)
            src = f"# {MARK}{label}\n" + epilogue.render_graph(pat, kernels, ctx.backend, ctx.reference_source)
            return Candidate(id=label, format="kernelbench", backend=ctx.backend, sources={"candidate.py": src})
        if pat.family == "epilogue":
            assert pat.heavy is not None
            kernel = mod.render(pat.program, p, abi_offset=1)
            src = f"# {MARK}{label}\n" + epilogue.render(pat.program, pat.heavy, kernel, ctx.backend,
                                                                 ctx.reference_source)
            return Candidate(id=label, format="kernelbench", backend=ctx.backend, sources={"candidate.py": src})
        src = mod.render(pat.program, p)
        name = "kernel.cpp" if ctx.backend == "cpu" else "kernel.cu"
        return Candidate(id=label, format="fast", backend=ctx.backend, sources={name: src})


def _whole_rope(pat: Pattern, p) -> bool:
    """A rope parameter set for a graph whose outputs are all one rotary embedding's (the module's outputs as they
    are, no view after the kernel)."""
    r = pat.program.rope if pat.program is not None else None
    return isinstance(p, cuda.CudaParams) and p.layout == "rope" and r is not None and pat.plan is not None \
        and len(r.xs) == len(pat.plan.outputs) and all(not o.get("views") for o in pat.plan.outputs)


def skips_work(ctx: ProblemContext) -> bool:
    """Does the catalog find work a mask makes unneeded (runner.catalog.skipping)? A kernel that skips it moves fewer
    bytes than the memory floor counts (the pattern is captured once per source, and kept for the proposers)."""
    prog = CatalogProposer().pattern(ctx).program
    return prog is not None and (prog.limit is not None or prog.skip_zero is not None)


def catalog_proposers() -> list[CatalogProposer]:
    """What `fusebot optimize` uses when no LLM is configured."""
    return [CatalogProposer()]
