"""What a kernel engineer needs to know before writing code, as prompt sections: the arguments of every shape set the
harness verifies (shapes, dtypes, strides, alignment), the exact compile command and how to ask for more flags, the
device's limits, and how the harness times a call. Pure functions of the problem context.

A candidate asks for compiler flags with a line of its own, `// fusebot-flags: fast-math sm_90a`: `fast-math` is
nvcc's --use_fast_math (g++'s -ffast-math on the CPU), `sm_90a` adds the architecture-specific target (wgmma, TMA,
setmaxnreg) beside the harness's own where the device is sm_90. Nothing else is accepted.
"""

from __future__ import annotations

import re

from runner.harness.build import CPU_FLAGS, CUDA_FLAGS
from runner.search.types import InputSet, ProblemContext, TensorInfo

FLAGS_LINE = re.compile(r"^\s*//\s*fusebot-flags:(.*)$", re.M)
_ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8, "bool": 1,
                  "uint8": 1, "int8": 1}
ALIGNMENT_BYTES = {"cuda": 256, "cpu": 64}  # each argument is its own allocation (torch's allocators)


def requested_flags(source: str, ctx: ProblemContext) -> list[str]:
    """The compiler flags a candidate's `// fusebot-flags:` line asks for, of those allowed."""
    words = [w for m in FLAGS_LINE.finditer(source) for w in m.group(1).split()]
    out = []
    if "fast-math" in words:
        out.append("--use_fast_math" if ctx.backend == "cuda" else "-ffast-math")
    arch = ctx.gpu.cuda_arch if ctx.gpu else None
    if "sm_90a" in words and ctx.backend == "cuda" and arch == "sm_90":
        out.append("-gencode=arch=compute_90a,code=sm_90a")
    return out


def compile_command(ctx: ProblemContext) -> str:
    if ctx.backend == "cuda":
        arch = (ctx.gpu.cuda_arch if ctx.gpu else None) or "sm_90"
        num = arch.removeprefix("sm_")
        cmd = f"nvcc {' '.join(CUDA_FLAGS)} -gencode=arch=compute_{num},code={arch} -I. -o kernel.so kernel.cu"
        extra = ("fast-math sm_90a" if arch == "sm_90" else "fast-math")
        return (f"## How it is built\n`{cmd}` (no torch headers, no other libraries). To add flags, put a line "
                f"`// fusebot-flags: {extra}` in the file: `fast-math` adds --use_fast_math"
                + ("; `sm_90a` adds -gencode=arch=compute_90a,code=sm_90a (wgmma, TMA, setmaxnreg)" if arch == "sm_90"
                   else "") + ". Nothing else is accepted.")
    return (f"## How it is built\n`g++ {' '.join(CPU_FLAGS)} -I. -o kernel.so kernel.cpp`. To add -ffast-math, put a "
            "line `// fusebot-flags: fast-math` in the file. Nothing else is accepted.")


def _row_alignment(t: TensorInfo, backend: str) -> str:
    size = _ELEMENT_BYTES.get(t.dtype, 4)
    if not t.shape:
        return "scalar"
    row = t.shape[-1] * size
    for align in (16, 8, 4):
        if row % align == 0:
            return f"{row} B rows, {align}-byte aligned" + (" (float4 loads fit)" if align == 16 else "")
    return f"{row} B rows, not 4-byte aligned"


def inputs_section(ctx: ProblemContext) -> str:
    """A table per verified shape set: what fusebot_forward receives, in order, and what it must write."""
    if not ctx.inputs:
        return ""
    align = ALIGNMENT_BYTES.get(ctx.backend, 64)
    lines = ["## Arguments, for every shape the harness verifies (a kernel must be correct on each)",
             f"Every tensor is contiguous and starts at its own allocation (at least {align}-byte aligned); strides "
             "are in elements. Read sizes from the tensors: a kernel hard-coding the first shape fails the second."]
    for s in ctx.inputs:
        label = "the problem's inputs (timed)" if s.shape_set == 0 else "the second shape (verified, not timed)"
        lines.append(f"### Shape set {s.shape_set}: {label}\n| # | argument | role | dtype | shape | strides | rows |\n"
                     "| --- | --- | --- | --- | --- | --- | --- |")
        k = {"in": 0, "out": 0}
        for t in s.tensors:
            side = "out" if t.role == "output" else "in"
            idx = f"{side}[{k[side]}]"
            k[side] += 1
            lines[-1] += (f"\n| {idx} | {t.name} | {t.role} | {t.dtype} | {list(t.shape)} | {list(t.strides)} | "
                          f"{_row_alignment(t, ctx.backend)} |")
    return "\n".join(lines)


def limits_section(ctx: ProblemContext) -> str:
    g = ctx.gpu
    if g is None or ctx.backend != "cuda":
        return ""
    facts = [(g.sm_count, "SMs"), (g.smem_per_block_bytes, "bytes of shared memory per block (opt-in maximum)"),
             (g.smem_per_sm_bytes, "bytes of shared memory per SM"), (g.regs_per_sm, "32-bit registers per SM"),
             (g.max_threads_per_sm, "threads per SM"), (g.l2_bytes, "bytes of L2")]
    shown = [f"{v} {what}" for v, what in facts if v]
    return "## Device limits\n- " + "\n- ".join(shown) + "\n- at most 255 registers per thread, 1024 threads per block" \
        if shown else ""


def timing_section(ctx: ProblemContext) -> str:
    if ctx.backend == "cuda":
        how = ("CUDA events around each call; before every call the L2 is flushed (a buffer twice its size is "
               "zeroed), so inputs come from HBM")
    else:
        how = "a monotonic clock around each call; a 64 MB buffer is written before every call to flush the caches"
    return ("## How it is timed\n"
            f"The median of many calls, each timed with {how}. Each call goes through the drop-in module a user "
            "runs (state lookup, output allocation, the ctypes call, your launches): host work counts, so one launch "
            "beats several. Every timed call gets fresh inputs (scaled copies), so nothing can be cached between "
            "calls, and samples of its outputs are checked.")


def input_set(shape_set: int, tensors: list[dict]) -> InputSet:
    return InputSet(shape_set=shape_set, tensors=[TensorInfo.model_validate(t) for t in tensors])
