"""Prompts for the LLM proposer: pure functions of data (problem context, history, verdicts) to chat messages.

Every prompt carries the reference source, the target (GPU name, specs, measured ceilings, or the CPU), the roofline
floor and the baselines. Ideas and implementations also see the best attempts so far with their code and measured
times, slower verified variants beside them (so the model can reason about why one was faster), and recent failures
with their reasons. A repair sees the failed code with the compiler's or checker's messages.
"""

from __future__ import annotations

from runner.contract import Candidate, Verdict
from runner.harness.build import CPU_FLAGS
from runner.proposers.llm.facts import compile_command, inputs_section, limits_section, timing_section
from runner.search.types import Attempt, History, Idea, ProblemContext

Messages = list[dict[str, str]]

MAX_CODE_CHARS = 12_000
MAX_LOG_CHARS = 4_000
SHOW_BEST = 3  # when the history carries no beam
SHOW_SLOWER = 2
SHOW_FAILED = 6
SHOW_IDEAS = 30


def _cut(text: str, limit: int, *, keep: str = "head") -> str:
    if len(text) <= limit:
        return text
    if keep == "tail":
        return f"[... {len(text) - limit} characters cut ...]\n" + text[-limit:]
    return text[:limit] + f"\n[... {len(text) - limit} characters cut ...]"


def _fence(code: str, lang: str) -> str:
    return f"```{lang}\n{code.rstrip()}\n```"


def source_lang(ctx: ProblemContext) -> str:
    if ctx.format == "kernelbench":
        return "python"
    return "cuda" if ctx.backend == "cuda" else "cpp"


def source_filename(ctx: ProblemContext) -> str:
    if ctx.format == "kernelbench":
        return "candidate.py"
    return "kernel.cu" if ctx.backend == "cuda" else "kernel.cpp"


def target_section(ctx: ProblemContext) -> str:
    lines = ["## Target"]
    if ctx.backend == "cpu":
        lines.append("- CPU backend: the kernel is C++ built by the system compiler into a shared library.")
    if ctx.gpu is not None:
        lines.append(f"- Device: {ctx.gpu.name}" + (f" ({ctx.gpu.specs})" if ctx.gpu.specs else ""))
        if ctx.gpu.copy_bandwidth_bytes_per_s:
            lines.append(f"- Measured copy bandwidth: {ctx.gpu.copy_bandwidth_bytes_per_s / 1e12:.3f} TB/s")
        if ctx.gpu.notes:
            lines.append(f"- {ctx.gpu.notes}")
    if ctx.input_summary:
        lines.append(f"- Inputs: {ctx.input_summary}")
    if ctx.baselines is not None:
        for label, t in (("PyTorch eager", ctx.baselines.eager), ("torch.compile", ctx.baselines.compile)):
            if t is not None:
                lines.append(f"- {label}: median {t.median_ms:.4g} ms (n={t.n})")
    if ctx.roofline is not None:
        r = ctx.roofline
        lines.append(f"- Roofline floor: {r.floor_ms:.4g} ms ({r.bytes_moved} bytes that must move at "
                     f"{r.bandwidth_bytes_per_s / 1e9:.1f} GB/s, {r.bandwidth_source}); no correct kernel is faster")
    best = ctx.baseline_best_ms
    if best is not None:
        lines.append(f"- To count, a kernel must beat {best:.4g} ms (the faster baseline).")
    return "\n".join(lines)


def format_rules(ctx: ProblemContext, abi_header: str) -> str:
    lang = source_lang(ctx)
    if ctx.format == "kernelbench":
        return ("## What to write\nOne complete Python file defining `class ModelNew(nn.Module)` with the same "
                "constructor arguments and forward signature as `Model`, computing the same outputs. Custom kernels "
                "may be built with torch.utils.cpp_extension.load_inline. No fallback to the reference, no caching of "
                "results, no other streams or threads.")
    where = (
        "Launch every kernel on `stream` (a cudaStream_t) and on nothing else; do not synchronize the device."
        if ctx.backend == "cuda"
        else f"`stream` is NULL. C++17, built with {' '.join(f for f in CPU_FLAGS if f not in ('-shared', '-fPIC'))}."
    )
    return (
        "## What to write\n"
        f"One complete {'CUDA-C (.cu, built by nvcc)' if ctx.backend == 'cuda' else 'C++ (.cpp)'} source file with no "
        "torch headers that `#include \"fusebot.h\"` and exports\n"
        "`extern \"C\" int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, "
        "void* stream)`.\n"
        "`in` holds the forward's arguments, then the module's parameters and buffers in state_dict order; `out` is "
        "preallocated (contiguous, the reference's shapes and dtypes) and must be completely written. Read shapes from "
        f"the tensors; do not hard-code sizes. Return 0 on success. {where}\n"
        "The harness checks results on fresh random inputs against the reference (fp32 atol=rtol=1e-4 unless the "
        "problem says otherwise), rejects any kernel that caches, skips work, or escapes the timer.\n"
        f"fusebot.h:\n{_fence(abi_header, 'c')}\n\n{compile_command(ctx)}\n\n{timing_section(ctx)}\n\n"
        "Before the code, write a short performance analysis (a few lines): where the time of the best kernel so far "
        "goes (bytes moved against the floor, launches, occupancy, the second shape's sizes) and what this kernel "
        f"changes about it. Then the whole file in ONE fenced ```{lang} block."
    )


def _attempt_line(a: Attempt, base_ms: float | None, floor_ms: float | None = None) -> str:
    if a.accepted and a.median_ms is not None:
        t = a.verdict.timing if a.verdict else None
        speed = f", {base_ms / a.median_ms:.2f}x the faster baseline" if base_ms else ""
        spread = f" (IQR {t.iqr_ms:.3g} ms, n={t.n})" if t else ""
        floor = f", {100 * floor_ms / a.median_ms:.0f}% of the roofline floor" if floor_ms else ""
        build = a.verdict.build if a.verdict else None
        hw = f"; ptxas: {build.kernels_text()}" if build and build.kernels else ""
        return f"{a.median_ms:.4g} ms{spread}{speed}{floor}{hw}"
    return "rejected: " + "; ".join(_cut(r, 300) for r in a.reasons) if a.reasons else "rejected"


def history_section(ctx: ProblemContext, history: History, current: str | None = None) -> str:
    """The best kernels with code and times, slower variants to contrast, failures with their reasons, the ideas
    tried. Identical code is shown once (at its best time); `current` (the idea being implemented) is not listed
    as tried, and a failure of an idea that also produced a verified kernel is not listed as a failure."""
    base = ctx.baseline_best_ms
    floor = ctx.roofline.floor_ms if ctx.roofline else None
    accepted, seen = [], set()
    for a in history.accepted():
        code = _source(a.candidate)
        if code not in seen:
            seen.add(code)
            accepted.append(a)
    parts: list[str] = []
    if accepted:
        # the search's beam when it keeps one, else the fastest few
        in_beam = set(history.beam)
        best = [a for a in accepted if a.candidate and a.candidate.id in in_beam] if in_beam else accepted[:SHOW_BEST]
        best = best or accepted[:SHOW_BEST]
        parts.append("## Best verified kernels so far (fastest first; measured by the harness)")
        for n, a in enumerate(best, 1):
            parts.append(f"### Best {n}: {_attempt_line(a, base, floor)}\nIdea: {a.idea}\n"
                         + _fence(_cut(_source(a.candidate), MAX_CODE_CHARS), source_lang(ctx)))
        slower = [a for a in accepted if a not in best][-SHOW_SLOWER:]
        if slower:
            parts.append("## Slower verified variants (compare with the best: what made those faster?)")
            for a in slower:
                parts.append(f"### {_attempt_line(a, base, floor)}\nIdea: {a.idea}\n"
                             + _fence(_cut(_source(a.candidate), MAX_CODE_CHARS // 2), source_lang(ctx)))
    worked = {a.idea for a in accepted}
    failed = [a for a in history.failed() if a.idea not in worked][-SHOW_FAILED:]
    if failed:
        parts.append("## Recent failures (their reasons)")
        parts.extend(f"- {a.idea} -> {_attempt_line(a, base)}" for a in failed)
    tried = [i.text for i in history.ideas if i.text != current][-SHOW_IDEAS:]
    if tried:
        parts.append("## Ideas already tried\n" + "\n".join(f"- {t}" for t in tried))
    return "\n\n".join(parts)


def _source(c: Candidate | None) -> str:
    return "\n".join(c.sources.values()) if c else ""


def _system(ctx: ProblemContext) -> dict[str, str]:
    device = "GPU" if ctx.backend == "cuda" else "CPU"
    return {"role": "system", "content": (
        f"You are an expert {device} performance engineer. You write fused kernels that compute exactly what a "
        "PyTorch reference computes, faster. Every kernel is verified on random inputs, on edge values and on "
        "inputs holding NaN and infinities (NaN and infinities must come out where PyTorch's do: relu and clamps "
        "keep a NaN, so `x < 0 ? 0 : x`, not `fmaxf(x, 0)`), and timed by a strict harness; only measured results "
        "count.")}


def _problem(ctx: ProblemContext) -> str:
    sections = [f"## Reference ({ctx.name})\n{_fence(ctx.reference_source, 'python')}", target_section(ctx),
                limits_section(ctx), inputs_section(ctx)]
    return "\n\n".join(s for s in sections if s)


def ideas_prompt(ctx: ProblemContext, history: History, n: int) -> Messages:
    hist = history_section(ctx, history)
    user = (
        f"{_problem(ctx)}\n\n{hist + chr(10) * 2 if hist else ''}"
        f"## Task: ideas\nPropose {n} distinct optimization ideas for a faster kernel for this reference, in plain "
        "language (no code yet). Reason about where the time goes (memory traffic vs. compute, launches, "
        "reductions), what the best kernels so far do and why they were faster than the slower ones, and what "
        "has not been tried. Each idea: one or two sentences, concrete (memory access pattern, parallel "
        f"decomposition, fusion, vector width, ...).\nAnswer as a numbered list of exactly {n} items."
    )
    return [_system(ctx), {"role": "user", "content": user}]


def implement_prompt(ctx: ProblemContext, idea: Idea, history: History, abi_header: str, variant: int = 0,
                     variants: int = 1) -> Messages:
    hist = history_section(ctx, history, current=idea.text)
    which = f" This is variant {variant + 1} of {variants}: make choices different from the other variants." \
        if variants > 1 else ""
    user = (
        f"{_problem(ctx)}\n\n{hist + chr(10) * 2 if hist else ''}{format_rules(ctx, abi_header)}\n\n"
        f"## Task: implement this idea\n{idea.text}\n{which}"
    )
    return [_system(ctx), {"role": "user", "content": user}]


def verdict_message(ctx: ProblemContext, candidate: Candidate, verdict: Verdict) -> str:
    """The harness's verdict on a kernel, as the next turn of the conversation that wrote it."""
    reasons = "\n".join(f"- {_cut(r, 1500)}" for r in verdict.reasons) or "- (no reason given)"
    log = verdict.build.log if verdict.build and verdict.build.log else ""
    trials = [f"- trial {t.index} ({t.distribution}{', second shape' if t.shape_set else ''}): "
              f"max_abs_err={t.max_abs_err} max_rel_err={t.max_rel_err} mismatched={t.mismatched}/{t.numel} "
              f"{'; '.join(t.reasons)}" for t in verdict.trials if not t.passed]
    return (
        f"## Task: repair\nThis kernel (idea: {candidate.idea or 'n/a'}) was rejected at the {verdict.stage} stage.\n"
        f"### The harness's reasons\n{reasons}\n"
        + (f"### Compiler output\n```\n{_cut(log, MAX_LOG_CHARS, keep='tail')}\n```\n" if log else "")
        + ("### Failed trials\n" + "\n".join(trials[:8]) + "\n" if trials else "")
        + "Find the cause, then give the whole corrected file."
    )


def repair_prompt(ctx: ProblemContext, candidate: Candidate, verdict: Verdict, abi_header: str) -> Messages:
    """A repair of a kernel whose conversation is not known (it came from elsewhere): its code and verdict."""
    user = (
        f"{_problem(ctx)}\n\n{format_rules(ctx, abi_header)}\n\n"
        f"### The rejected kernel\n{_fence(_cut(_source(candidate), MAX_CODE_CHARS), source_lang(ctx))}\n\n"
        + verdict_message(ctx, candidate, verdict)
    )
    return [_system(ctx), {"role": "user", "content": user}]


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def no_code_message(ctx: ProblemContext, why: str) -> str:
    """The turn after an answer with no usable code: what was wrong with it, and what to send instead."""
    return (f"## Task: answer again\nYour last answer could not be used: {why}.\nKeep the explanation to a few "
            f"lines and give the whole file in ONE fenced ```{source_lang(ctx)} block"
            + (", complete to its last brace." if ctx.format == "fast" else "."))


# ---- shrinking a prompt the model's context cannot hold -----------------------------------------------------------

SHRINK_LEVELS = 4  # 0: whole; 1: only the latest attempt of a conversation; 2: no history sections; 3: no comments
_HISTORY_HEADS = ("## Best verified kernels", "## Slower verified variants", "## Recent failures",
                  "## Ideas already tried", "## Earlier variants")


def strip_comments(source: str) -> str:
    """Python source without its comments and blank lines (the code is unchanged)."""
    out = []
    for line in source.splitlines():
        code = line.split("#", 1)[0].rstrip() if "#" in line and "'" not in line and '"' not in line else line
        if code.strip():
            out.append(code)
    return "\n".join(out) + "\n"


def _drop_history(text: str) -> str:
    parts = text.split("\n\n## ")
    kept = [parts[0]] + [p for p in parts[1:] if not ("## " + p).startswith(_HISTORY_HEADS)]
    return "\n\n## ".join(kept)


def shrink(messages: Messages, level: int, reference_source: str) -> Messages:
    """The messages at shrink level `level` (0: as they are)."""
    out = [dict(m) for m in messages]
    if level >= 1 and len(out) > 4:  # a conversation: the task, then only its latest attempt and verdict
        dropped = (len(out) - 4) // 2
        out = out[:2] + out[-2:]
        out[-1]["content"] = f"[{dropped} earlier attempt(s) dropped to fit the model's context]\n" + out[-1]["content"]
    if level >= 2:
        out[1]["content"] = _drop_history(out[1]["content"])
    if level >= 3:
        stripped = strip_comments(reference_source)
        for m in out:
            m["content"] = m["content"].replace(reference_source.rstrip(), stripped.rstrip())
    return out
