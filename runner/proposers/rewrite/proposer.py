"""Source rewrites: the user's own module, made faster by rewriting its PyTorch source, no kernel.

The proposer reads the module file (the target class's forward and what it reaches in the same file:
runner/proposers/rewrite/source.py), finds algebraic and library rewrites there (runner/proposers/rewrite/rules.py,
activations.py), and proposes each rewritten file as a KernelBench candidate: the file with the target
class aliased to `ModelNew`, so the harness builds it with the reference's constructor arguments and seed (the same
parameters) and verifies and times it as any candidate. `Candidate.rewrite` carries the file's full new text, which
a PR shows as a diff of the user's own file.

Ideas: every site together (when there are several), then each site alone, so the simplest change that is as fast
can win. It runs in the first round beside the catalog (`first_round_ideas`, outside the shares of
runner/search/loop.py); a module with nothing to rewrite gives no ideas and logs nothing.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from runner.contract import Candidate, Verdict
from runner.proposers.rewrite.activations import activation
from runner.proposers.rewrite.attention import attention
from runner.proposers.rewrite.copies import clone_copy, contiguous_copy, named_clone, repeated_conversion
from runner.proposers.rewrite.edit import apply
from runner.proposers.rewrite.match import Rule, Site, scan
from runner.proposers.rewrite.rules import diag_product, layer_norm, linear_bias, log_softmax, rms_norm, softmax
from runner.proposers.rewrite.source import Module
from runner.search.types import History, Idea, ProblemContext, Session

log = logging.getLogger(__name__)

# runner/pipeline.py's kernelbench_aliases() appends this block to a repository target's source: the target's names
# as KernelBench's (Model = RowGain, get_inputs, ...); the user's file is what comes before it
ALIASES_MARK = "\n\n\n# fusebot: this target under KernelBench's names\n"
CANDIDATE_FILE = "model_new.py"
MAX_SINGLES = 6  # sites proposed one by one beside all of them together

RULES: list[tuple[str, Rule]] = [
    ("attention", attention),
    ("diag-product", diag_product),
    ("linear-bias", linear_bias),
    ("softmax", softmax),
    ("log-softmax", log_softmax),
    ("layer-norm", layer_norm),
    ("rms-norm", rms_norm),
    ("activation", activation),
    ("contiguous", contiguous_copy),
    ("clone", clone_copy),
    ("named-clone", named_clone),
    ("repeated-conversion", repeated_conversion),
]


@dataclass(frozen=True)
class Rewrite:
    """A rewritten module file and the sites it changed."""

    text: str
    sites: tuple[Site, ...]

    def idea(self) -> str:
        parts = [f"{s.lines}: `{s.old}` -> `{s.new}`: {s.words}" for s in self.sites]
        return "Rewrite the module's PyTorch source (no kernel). " + "; ".join(parts) + "."


def split_reference(source: str) -> tuple[str, str]:
    """(the user's module file, the KernelBench alias block the pipeline appended, or "")."""
    k = source.find(ALIASES_MARK)
    return (source, "") if k < 0 else (source[:k], source[k:])


def target_class(aliases: str) -> str:
    """The class the problem's `Model` names: `Model = RowGain`, `def Model(*args): return RowGain(...)`, or Model."""
    for line in aliases.splitlines():
        line = line.strip()
        if line.startswith("Model = "):
            return line.split("=", 1)[1].strip()
        if line.startswith("return ") and "(*args" in line:
            return line[len("return "):].split("(", 1)[0].strip()
    return "Model"


def rewrites(text: str, class_name: str) -> list[Rewrite]:
    """Every rewrite of the file: all sites together first (when several), then each alone."""
    try:
        mod = Module(text, class_name)
    except SyntaxError:
        return []
    sites: list[Site] = []
    for f in mod.funcs:
        sites += scan(f, RULES)
    groups = ([tuple(sites)] if len(sites) > 1 else []) + [(s,) for s in sites[:MAX_SINGLES]]
    out: list[Rewrite] = []
    for group in groups:
        new = apply(text, [e for s in group for e in s.edits])
        if new is None:
            log.info("rewrite: %s did not apply cleanly", ", ".join(f"{s.lines} ({s.rule})" for s in group))
        elif new != text and all(r.text != new for r in out):
            out.append(Rewrite(new, group))
    return out


def candidate_source(rewritten: str, aliases: str, class_name: str) -> str:
    """The KernelBench candidate: the rewritten file, the problem's alias block, and the class as ModelNew."""
    return (rewritten.rstrip("\n") + "\n" + aliases.rstrip("\n") +
            f"\n\n\n# fusebot: the rewritten module under KernelBench's candidate name\nModelNew = {class_name}\n")


class RewriteProposer:
    """Source rewrites of the user's module as KernelBench candidates (a builtin proposer: no model, no network)."""

    name = "rewrite"
    first_round_ideas = 1 + MAX_SINGLES  # the loop gives it these in the first round, beside the catalog's share

    def __init__(self) -> None:
        self._found: dict[str, list[Rewrite]] = {}

    def bind(self, session: Session) -> None:
        pass  # no answers to cache, no tokens to meter

    def found(self, ctx: ProblemContext) -> list[Rewrite]:
        key = hashlib.sha256(ctx.reference_source.encode()).hexdigest()
        if key not in self._found:
            user, aliases = split_reference(ctx.reference_source)
            self._found[key] = rewrites(user, target_class(aliases))
            if self._found[key]:
                log.info("rewrite: %s: %d source rewrite(s) of its module", ctx.name, len(self._found[key]))
        return self._found[key]

    def ideas(self, ctx: ProblemContext, history: History, n: int) -> list[Idea]:
        tried = {a.candidate.rewrite for a in history.attempts if a.candidate is not None and a.candidate.rewrite}
        return [Idea(text=r.idea()) for r in self.found(ctx) if r.text not in tried][:n]

    def implement(self, ctx: ProblemContext, idea: Idea, history: History, n: int) -> list[Candidate]:
        chosen = next((r for r in self.found(ctx) if r.idea() == idea.text), None)
        if chosen is None or n < 1:
            return []
        _, aliases = split_reference(ctx.reference_source)
        digest = hashlib.sha256(chosen.text.encode()).hexdigest()[:12]
        source = candidate_source(chosen.text, aliases, target_class(aliases))
        return [Candidate(id=f"rewrite-{digest}", format="kernelbench", backend=ctx.backend,
                          sources={CANDIDATE_FILE: source}, idea=idea.text, rewrite=chosen.text,
                          preconditions=[s.precondition for s in chosen.sites if s.precondition])]

    def repair(self, ctx: ProblemContext, candidate: Candidate, verdict: Verdict) -> Candidate | None:
        return None  # a rewrite is equivalent or it is not; the verdict says which


def rewrite_proposers() -> list[RewriteProposer]:
    return [RewriteProposer()]
