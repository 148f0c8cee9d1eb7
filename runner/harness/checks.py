"""Checks on a candidate that are not a comparison of values: what its source shows before it runs, what the
profiler saw it launch, and whether the problem itself can show a speedup at all."""

from __future__ import annotations

import ast
from collections import Counter

from runner.contract import Candidate
from runner.harness.procs.profile import declared_kernels


def _called_names(fn: ast.AST) -> set[str]:
    """Names `fn` calls directly: `name(...)` and `self.name(...)`."""
    names = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Call):
            if isinstance(n.func, ast.Name):
                names.add(n.func.id)
            elif isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and n.func.value.id == "self":
                names.add(n.func.attr)
    return names


def _catches(fn: ast.AST) -> bool:
    return any(isinstance(n, ast.Try | ast.TryStar) for n in ast.walk(fn))


def static_checks(candidate: Candidate) -> list[str]:
    """Checks that need no run: a KernelBench ModelNew.forward that catches exceptions, or calls a function of the
    candidate's own file (a method, a module-level function) that does, has a silent fallback."""
    reasons: list[str] = []
    if candidate.format != "kernelbench":
        return reasons
    src = next(iter(candidate.sources.values()), "")
    try:
        tree = ast.parse(src)
    except SyntaxError as exc:
        return [f"load: candidate.py:{exc.lineno}: SyntaxError: {exc.msg}"]
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            methods = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
            forward = methods.get("forward")
            if forward is None:
                continue
            if _catches(forward):
                reasons.append("fallback: ModelNew.forward catches exceptions (try/except): a silent "
                               "fallback to the reference is not allowed")
            for name in sorted(_called_names(forward)):
                callee = methods.get(name) or functions.get(name)
                if callee is not None and callee is not forward and _catches(callee):
                    reasons.append(f"fallback: {name}, called by ModelNew.forward, catches exceptions (try/except): "
                                   "a silent fallback to the reference is not allowed")
    return reasons


def kernel_checks(candidate: Candidate, reply: dict, reference_kernels: list[str]) -> list[str]:
    """From the profiler's view of one call: the candidate's own kernels ran, on the caller's stream only, and it
    did not simply rerun the reference's kernels. A source rewrite of the reference (`Candidate.rewrite`) runs
    library kernels by design: only the stream check applies to it."""
    reasons: list[str] = []
    kernels = reply.get("kernels")
    rewrite = bool(candidate.rewrite)  # a source rewrite of the reference runs library kernels, none of its own
    if kernels is None:
        if reply.get("own_code_ran") is False and not rewrite:
            reasons.append("no-kernel: none of the candidate's own compiled functions ran during the call")
        return reasons
    names = [k["name"] for k in kernels]
    declared = declared_kernels(candidate.sources)
    if not declared and not rewrite:
        reasons.append("no-kernel: the candidate defines no __global__ kernel of its own")
    elif declared and not any(d in n for n in names for d in declared):
        ran = ", ".join(sorted(set(names))[:5]) or "nothing"
        reasons.append(f"no-kernel: the profiler shows none of the candidate's kernels ({', '.join(declared)}) ran; "
                       f"it launched: {ran}")
    marker = reply.get("marker_stream")
    others = sorted({k["stream"] for k in kernels if k["stream"] != marker}, key=str)
    if marker is not None and others:
        reasons.append(f"side-stream: kernels ran on stream(s) {others} besides the caller's stream {marker}: work "
                       "escaped the caller's stream, and with it a timer on that stream")
    ref = Counter(reference_kernels)
    if ref and not (ref - Counter(names)) and not rewrite:
        reasons.append("fallback: the candidate launched every kernel the reference launches "
                       f"({', '.join(sorted(ref)[:3])}): it reruns the reference")
    return reasons


def degenerate_reason(digests: list[tuple[str, bool, list | None, float]]) -> str | None:
    """Why no speedup on this problem is real (its output ignores its input, or is near-constant), from the
    reference's trials: (fingerprint, near-constant, [min, max] of its values, the atol its check used) each."""
    prints = [d[0] for d in digests]
    if len(set(prints)) == 1 and len(prints) > 1:
        return "the reference's output is the same for every input drawn: it does not depend on its input"
    if digests and all(d[1] for d in digests):
        # every value within atol of every other in each trial, and across the trials too: a scalar (a loss) has
        # no spread within one output, yet it is not constant when each input drawn gives another value
        spans = [d[2] for d in digests if d[2]]
        tol = min(d[3] for d in digests)
        if not spans or max(s[1] for s in spans) - min(s[0] for s in spans) <= tol:
            return "the reference's output is (near-)constant: every value within atol of every other"
    return None
