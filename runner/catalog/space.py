"""The catalog's search space: for a recognised pattern, strategies (an idea in plain words) and, for each, the
parameter sets the search tunes, best guess first. Deterministic: the order depends only on the pattern's shapes,
dtype and backend.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from runner.catalog.codegen.common import NotExpressible, full_output, op_code, red_kinds, uses_general
from runner.catalog.codegen.cpu import CpuParams
from runner.catalog.codegen.cuda import CudaParams, broadcast_view
from runner.catalog.codegen.cuda.columns import strided_refusal
from runner.catalog.codegen.cuda.regs import short_row_params
from runner.catalog.codegen.cuda.rope import heads_fit as rope_heads_fit
from runner.catalog.codegen.cuda.rope import widths as rope_widths
from runner.catalog.ir import Op, Program, walk

SMS = 132  # H100; only the ordering of guesses depends on it


@dataclass
class Strategy:
    key: str
    text: str
    params: list  # CpuParams | CudaParams, best guess first


def _halfish(p: Program) -> bool:
    return p.out_dtype in ("float16", "bfloat16") or any(i.dtype in ("float16", "bfloat16") for i in p.inputs)


def _what(p: Program) -> str:
    kinds = red_kinds(p)
    if "lse" in kinds:
        return "the row's log-sum-exp (softmax family)"
    if "var" in kinds:
        return "the row's mean and variance (normalisation)"
    if kinds & {"argmax", "argmin"}:
        return "the row's arg-max/arg-min"
    if kinds:
        return f"the row's {'/'.join(sorted(kinds))}"
    return "the elementwise chain"


def _modes(p: Program) -> list[str]:
    return ["online", "twopass"] if red_kinds(p) & {"lse", "var"} else ["online"]


def strategies(p: Program, backend: str) -> list[Strategy]:
    """Every strategy for the program on the backend, most promising first."""
    return _cpu(p) if backend == "cpu" else _cuda(p)


def _cpu(p: Program) -> list[Strategy]:
    n = prod(p.shape) if p.shape else 1
    small = n < (1 << 20)
    threads = ["one", "all"] if small else ["all", "one"]
    out: list[Strategy] = []
    if not p.is_row:
        for t in threads:
            how = "one thread: at this size OpenMP start-up costs more than it saves" if t == "one" else \
                "OpenMP threads with SIMD lanes"
            out.append(Strategy(
                f"cpu-flat-{t}",
                f"One fused loop over the output computing {_what(p)} in registers: every input read once, the "
                f"output written once ({how}).",
                [CpuParams("flat", "online", t, False), CpuParams("flat", "online", t, True)]))
        return out
    _, _, inner = p.split()
    layouts = ["columns", "rows"] if inner > 1 else ["rows"]
    for lay in layouts:
        for mode in _modes(p):
            for t in threads:
                desc = ("accumulators for a whole line of inner elements so the innermost loop is contiguous"
                        if lay == "columns" else "one row per iteration, its passes as inner loops over the row")
                how = ("one pass (running max with a rescaled sum, or Welford mean and variance)" if mode == "online"
                       and red_kinds(p) & {"lse", "var"} else "the statistics first, then the exact second pass"
                       if mode == "twopass" else "one pass for the reductions")
                out.append(Strategy(
                    f"cpu-{lay}-{mode}-{t}",
                    f"Fuse {_what(p)} and the output into one kernel: {desc}; {how}; "
                    f"{'one thread' if t == 'one' else 'OpenMP over rows'}.",
                    [CpuParams(lay, mode, t, False), CpuParams(lay, mode, t, True)]))
    return out


# ---- the CUDA layouts' tuned sets, best guess first: data the functions below choose among -----------------------

ROPE_THREADS = (256, 128, 512)
ROPE_HEADS = (4, 8, 2)  # heads of one token per thread, where they fit
ROPE_HEADS_THREADS = (256, 128)
# round 1 implements each idea's first two sets: one pass of the grid with two and four vectors in flight per thread
# first (the one-pass grid beat grid-stride on the H100), then one, then grid-stride over one wave
FLAT_SETS = ((256, "once", 2), (256, "once", 4), (256, "once", 1), (256, "stride", 2), (512, "once", 2),
             (128, "once", 4), (256, "stride", 4), (512, "stride", 1))  # (threads, grid, vectors in flight)
FLAT_GENERAL_THREADS = (256, 512, 128)  # with an index from the strides per element: no unrolling
FLAT_GENERAL_GRIDS = ("once", "stride")
# (vector width divisor k: V = wide // k, column width, slices, unroll): a tile is CW * V columns; at most 512
# threads, so the merge's V lanes of any accumulator fit in static shared memory. On the H100, over (112, 64, 512,
# 512) fp32: RMSNorm 5.4 ms with float4 and 32x16 threads (unrolled 4 or not), 6.2 for the best scalar set (floor
# 5.0); LayerNorm (Welford) 6.6 with float2 32x8 unrolled 4 and with float4 32x16 unrolled 2, 7.1 scalar
COLUMNS_VECTOR_SETS = ((1, 32, 16, 4), (1, 32, 16, 2), (2, 32, 8, 4), (2, 64, 8, 1), (1, 64, 8, 4), (2, 32, 16, 4),
                       (1, 32, 16, 1), (1, 32, 8, 4), (2, 64, 8, 4), (1, 64, 8, 1), (2, 32, 16, 1), (1, 32, 8, 1))
# scalar sets, (slices) x (column width, unroll): the reduction loop unrolled 4 times by a pragma (four loads in flight
# per thread) alternates with the compiler's own unrolling (a pragma of 1, no unrolling, ran Max over (128, 4096,
# 4095) at 3.93 ms on the H100, 4 at 3.26)
COLUMNS_SCALAR_SLICES = (8, 4, 16, 1)
COLUMNS_SCALAR_WIDTHS = ((32, 1), (64, 4), (64, 1), (32, 4))
# (slices, threads, unroll). On the H100, Sum over (128, 4096, 4095) by a probe of this kernel: 2.94-3.04 ms (94-97% of
# the floor) against eager's 3.05 and the scalar columns' 3.3-3.4 in the harness
STRIDED_SETS = ((4, 256, 8), (2, 256, 8), (4, 128, 4), (8, 256, 8), (2, 256, 4), (4, 256, 2))
# a block's threads sized from the row: none idle through the passes and their barriers (a bf16 row of 1024 is 128
# vectors of 8: a block of 512 left three quarters of its threads without one)
ROWS_BLOCK_THREADS = (512, 256, 1024, 128)
ROWS_WARP_THREADS = (256, 128)
# (threads, unroll) of a row's blocks taking turns along it (few rows), or each holding a chunk
SPLIT_TURNS_SETS = ((512, 2), (256, 4))
SPLIT_CHUNK_SETS = ((512, 1), (256, 1))
# (buffers, threads) of a cluster holding its row
CLUSTER_SETS = ((1, (256, 128)), (1, (512,)), (2, (256,)))
GRID_THREADS = (256, 512)
BIG_ROW_THREADS = (256, 128)


def _cuda(p: Program) -> list[Strategy]:
    if not p.is_row:
        out = _rope(p) + _flat(p)
        if _fast_math_matters(p):
            out.append(Strategy("cuda-flat-fast",
                                "The same fused elementwise kernel with fast-math intrinsics (__expf, __fdividef, tanh "
                                "through exp): cheaper transcendental math, checked against the tolerance.",
                                [replace(x, fast_math=True) for x in out[0].params[:6]]))
        return out
    _, _, inner = p.split()
    return _columns(p) if inner > 1 else _rows(p)


def _access(p: Program) -> tuple[int, str]:
    """(elements per vector access, its name)."""
    return (8, "bfloat162/half2-or-wider") if _halfish(p) else (4, "float4")


def _rope(p: Program) -> list[Strategy]:
    if p.rope is None or not rope_widths(p):
        return []
    r, vs, out = p.rope, rope_widths(p), []
    how = ("x[j] and its partner x[j + rot/2] as two vectors at one offset" if r.style == "half" else
           "interleaved pairs inside one vector, the repeated cos/sin read half as wide")
    out.append(Strategy(
        "cuda-rope",
        f"A rotary-embedding kernel: one thread per vector of a head's features, {how}; cos and sin loaded once "
        f"per vector and applied to all {len(r.xs)} output(s) in one launch"
        + (f"; the {r.head - r.rot} features past the rotated {r.rot} copied as plain vectors"
           if r.rot < r.head else "") + f" ({vs[0]}-element vectors first).",
        [CudaParams("rope", vec=v, threads=t) for v in vs[:2] for t in ROPE_THREADS]))
    hs = [h for h in ROPE_HEADS if rope_heads_fit(r, h)]
    if hs:
        out.append(Strategy(
            "cuda-rope-heads",
            f"The rotary-embedding kernel with {hs[0]} heads of one token per thread: cos and sin loaded once for "
            "all of them (from L2 once per token instead of once per head), the heads' vectors loaded back to "
            "back.", [CudaParams("rope", vec=vs[0], threads=t, unroll=h) for h in hs for t in ROPE_HEADS_THREADS]))
    return out


def _flat(p: Program) -> list[Strategy]:
    wide, access = _access(p)
    out: list[Strategy] = []
    view = broadcast_view(p)
    general = [CudaParams("flat", vec=v, threads=t, grid=g) for v in (wide, wide // 2, 1) for t in FLAT_GENERAL_THREADS
               for g in FLAT_GENERAL_GRIDS]
    ps = [CudaParams("flat", vec=v, threads=t, grid=g, unroll=u) for v in (wide, wide // 2, 1) for t, g, u in FLAT_SETS]
    if view is not None:
        a, b, c = view.sizes
        seen = f"[{a}, {b}, {c}] ({a * b} rows of {c})" if view.three else f"{b} rows of {c}"
        bcs = [view.present[k] for k in p.used_inputs() if p.access(k) == "general"]
        kinds = []
        if any(pr[2] for pr in bcs):
            kinds.append("a vector along the row (like a bias b[None, :])")
        if any(not pr[2] for pr in bcs):
            kinds.append("a per-row value read once per vector (like a[:, None]"
                         + (" or a per-channel c[:, None, None])" if view.three else ")"))
        out.append(Strategy(
            "cuda-flat-broadcast",
            f"One fused elementwise kernel that reads the output as {seen}: each broadcast input is "
            f"{' or '.join(kinds)}, indexed from row and column counters each thread steps forward, with no "
            f"division per element; full inputs and the output keep {access} access ({wide} elements), several "
            "vectors in flight per thread.", [replace(x, layout="bcast") for x in ps]))
    if uses_general(p):  # an index from the strides per element: compute-bound, and unrolled slow to compile
        out.append(Strategy("cuda-flat-vector",
                            f"One fused elementwise kernel, {access} loads and stores of the full inputs "
                            f"({wide} elements per access) through the read-only path; broadcast inputs through "
                            "an index computed from their strides; one read of every input, one write.", general))
    else:
        out.append(Strategy("cuda-flat-vector",
                            f"One fused elementwise kernel, {access} loads and stores ({wide} elements per access) "
                            "through the read-only path, two to four vectors loaded per thread before any is "
                            "computed (more bytes in flight); one read of every input, one write.", ps))
    return out


def _columns(p: Program) -> list[Strategy]:
    """Reductions along a middle dim (an inner size over 1)."""
    wide, _ = _access(p)
    _, _, inner = p.split()
    out: list[Strategy] = []
    vecs = [v for v in (wide, wide // 2) if inner % v == 0]  # (a row not whole vectors runs the scalar kernel)
    for mode in _modes(p):
        ps = [CudaParams("columns", vec=wide // k, threads=w * s, col_width=w, slices=s, mode=mode, unroll=u)
              for k, w, s, u in COLUMNS_VECTOR_SETS if wide // k in vecs]
        ps += [CudaParams("columns", vec=1, threads=w * s, col_width=w, slices=s, mode=mode, unroll=u)
               for s in COLUMNS_SCALAR_SLICES for w, u in COLUMNS_SCALAR_WIDTHS]
        if vecs:
            load = "float4" if vecs[0] == 4 and not _halfish(p) else f"{vecs[0]}-element vector"
            how = (f"{load} loads across the contiguous inner dim, {vecs[0]} columns per thread with an accumulator "
                   "each (coalesced; narrower and scalar variants follow)")
        else:
            how = "threads across the contiguous inner dim (coalesced)"
        out.append(Strategy(f"cuda-columns-{mode}",
                            f"Reduce along a middle dim: {how}, slices of the reduced dim per block merged in "
                            f"shared memory; {_what(p)} {'in one pass' if mode == 'online' else 'in two passes'}, "
                            "then the output.", ps))
    if inner % wide and wide > 1 and _strided_fits(p):
        # the inner dim not whole vectors: the columns kernels would read it an element at a time
        out.insert(0, Strategy(
            "cuda-columns-strided",
            f"Reduce along a middle dim whose inner size is not whole vectors: a batch's slab is contiguous, so "
            f"{wide}-element vectors read at a stride of {wide} rows always hold the same {wide} (row class, "
            f"column) pairs: aligned, coalesced vector loads with an accumulator per lane; the partials of each "
            f"column merged by a second small kernel; {_what(p)} in one pass.",
            [CudaParams("strided", vec=wide, threads=t, slices=g, unroll=u) for g, t, u in STRIDED_SETS]))
    return out


def _rows(p: Program) -> list[Strategy]:
    """Reductions along the innermost dim: a row per block, warp, group of blocks or registers, or on chip."""
    wide, access = _access(p)
    rows, R, _ = p.split()
    modes = _modes(p)
    few_rows = rows < 2 * SMS
    short = R <= 2048
    block = [CudaParams("rows", vec=v, threads=t, group=0, mode=m)
             for m in modes for t in ROWS_BLOCK_THREADS for v in (wide, wide // 2) if t * v <= max(R, 128 * v)]
    warp = [CudaParams("rows", vec=v, threads=t, group=32, mode=m)
            for m in modes for v in (wide, wide // 2, 1) for t in ROWS_WARP_THREADS]
    # one or a few long rows (a whole-tensor norm): a row's blocks take turns along it, several vectors in flight
    # (Frobenius over 7.5 GB on the H100: 7.9 ms, against 8.5-8.7 with a contiguous chunk per block); more rows start
    # with a chunk per block and its turn-taking twin second (LayerNorm's 16 rows of 16.8 MB: 0.34 ms against
    # 0.39-0.44 taking turns with the first split kernels; with today's the twin is ahead, 0.300-0.302 against
    # 0.307-0.308 in two sweeps: docs/measurements.md, "Why these layouts")
    turns = rows < 8
    split = [CudaParams("split", vec=wide, threads=t, slices=s, mode=m, unroll=u, interleave=turns)
             for m in modes for s in _slices(rows) for t, u in (SPLIT_TURNS_SETS if turns else SPLIT_CHUNK_SETS)]
    if not turns:
        split.insert(1, replace(split[0], interleave=True))
    merge_once = turns and full_output(p)
    if merge_once:
        # the row's partials merged once by a small kernel, then the output pass a tile per block in the row's order
        # (Frobenius over 7.5 GB on the H100: that pass 4.94 ms, torch.compile's own 4.97, against 5.27-5.53 with
        # every block merging the partials and walking its turns; docs/measurements.md, "Why these layouts")
        split = [replace(x, grid="once") for x in split] + split
    s_block = Strategy("cuda-rows-block",
                       f"One block per row: {access} loads along the row, {_what(p)} merged by warp shuffles then "
                       "shared memory; one-pass online statistics or an exact two-pass, then the output pass "
                       "(the row is re-read from L2).", block)
    s_warp = Strategy("cuda-rows-warp",
                      f"One warp per row (short rows): {access} loads, shuffle-only merges, no shared memory or "
                      "block barriers.", warp)
    s_split = Strategy("cuda-rows-split",
                       "Several blocks per row (few long rows): each block reduces a slice into a workspace, the "
                       + ("partials are merged once by a small kernel, then the output pass runs a tile per block "
                          "along the row" if merge_once else
                          "next kernel merges the slices' partials and writes its slice of the output")
                       + ": every SM busy.",
                       split)
    order = [s_split, s_block, s_warp] if few_rows else ([s_warp, s_block, s_split] if short else
                                                          [s_block, s_warp, s_split])
    if rows < SMS // 4:
        # a block or a warp per row would leave three quarters of the GPU idle: split alone (the H100's hinge loss,
        # one row of 2^30: 124-238 ms for a block per row against 1.44-1.50 split, a round's budget spent on them)
        order = [s_split]
    regs = short_row_params(p) if not few_rows else []
    if regs:  # short rows, many of them: the row held in registers, read from memory once whatever the passes
        order = [Strategy("cuda-rows-regs", f"Short rows held in registers: a group of lanes (or the block) per row, "
                          f"several rows a block, {access} loads, the row read from memory once for every pass.",
                          regs), *order]
    order = _on_chip(p, order)
    fast = Strategy("cuda-rows-fast", "The best row layout with fast-math intrinsics (__expf, __logf, "
                    "__fdividef): cheaper exp/log in the reductions, checked against the tolerance.",
                    [replace(x, fast_math=True) for x in order[0].params[:4]])
    if _halfish(p) and _fast_math_matters(p):
        # a bf16 or fp16 row moves 4 bytes an element or less, which leaves about 60 instructions an element at the
        # memory floor on an H200 (4 schedulers of 32 lanes an SM over 2 elements a cycle): the accurate expf takes
        # 13 of them, __expf 2, and its error is far below a half dtype's rounding. Second, where a round tries it
        return [order[0], fast, *order[1:]]
    return [*order, fast]


def _on_chip(p: Program, order: list[Strategy]) -> list[Strategy]:
    """`order` with the layouts that keep a row on chip (a cluster's or a cooperative grid group's shared memory),
    first where the row is beyond L1, else after the others."""
    wide, _ = _access(p)
    _, R, _ = p.split()
    modes = _modes(p)
    row_bytes = R * sum(_bytes(i.dtype) for k, i in enumerate(p.inputs) if p.access(k) == "full")
    sizes = [c for c in (1, 2, 4, 8, 16) if row_bytes / c <= 200 * 1024]
    if sizes and row_bytes:
        # slices small enough for two blocks per SM first: a block waiting at a cluster barrier leaves the SM to
        # the other (one block with two buffers, prefetching its next row, ran slower on the H100: 7.68 against
        # 6.10 ms on InstanceNorm's 1 MB rows)
        cs = sorted(sizes, key=lambda c: (row_bytes / c > 112 * 1024, c))[:2]
        s_cluster = Strategy(
            "cuda-rows-cluster",
            f"Keep each row on chip: {'one block holds' if cs[0] == 1 else f'a cluster of {cs[0]} blocks holds'} the "
            "row in shared memory (distributed shared memory across the cluster), so the row is read once and "
            f"written once however many passes {_what(p)} needs; partials merge through DSMEM.",
            # the row is on chip, so a second pass over it is cheap: exact two-pass first
            # half-width vectors first: on the H100 8-byte accesses beat float4 on chip (InstanceNorm on clusters of
            # 16: 5.47 against 6.52 ms; softmax on a grid group of 16: 5.35 against 5.51)
            # the first pass taking the slice in 4 parts as they land, where the output is the row's and the row is
            # whole vectors, first (H100, two-pass on clusters of 16, 4 parts against 1: log-softmax 4.59 against
            # 5.15 ms with 8-byte vectors, 4.79 against 4.80 with 16-byte ones, 4.54 on clusters of 8; softmax 4.75
            # against 4.83; InstanceNorm 5.30 against 5.41; docs/measurements.md, "Why these layouts")
            [*(CudaParams("cluster", vec=v, threads=256, slices=c, mode=sorted(modes, reverse=True)[0], buffers=1,
                          chunks=4) for c, v in dict.fromkeys(((cs[0], wide // 2), (cs[0], wide), (cs[-1], wide)))
               if wide > 2 and R % wide == 0 and full_output(p)),
             *(CudaParams("cluster", vec=v, threads=t, slices=c, mode=m, buffers=b) for m in sorted(modes, reverse=True)
               for b, ts in CLUSTER_SETS for c in cs for t in ts for v in (wide // 2, wide))])
        # the same on a group of co-resident blocks of a cooperative grid, partials through global memory: no
        # cluster's placement limits (softmax over 4096 x 393216 on the H100: 5.35 ms against 5.53-5.56 on clusters)
        s_grid = Strategy(
            "cuda-rows-grid",
            f"Keep each row on chip across a group of {max(2, cs[0])} resident blocks of one cooperative grid (not a "
            "cluster: no limit of 16 blocks in one GPC), a slice each in shared memory, so the row is read once and "
            f"written once; {_what(p)} merged through a global workspace, a row's blocks waiting on its counter.",
            [CudaParams("grid", vec=v, threads=t, slices=max(2, c), mode=m, buffers=1) for m in sorted(modes, reverse=True)
             for c in cs for t in GRID_THREADS for v in (wide // 2, wide)])
        # a row beyond L1 would be re-read from L2 or memory by the other layouts: on chip first
        return [s_cluster, s_grid, *order] if row_bytes > 96 * 1024 else [*order, s_cluster, s_grid]
    if row_bytes and _big_row_groups(row_bytes, 2) >= 2:
        # rows beyond a cluster that still fit on chip several at a time (GroupNorm's 8 MB rows: three groups of 88
        # blocks at two per SM, 7.27-7.35 ms on the H100, against 7.9 for every other layout): a group of blocks
        # per row, its slices in shared memory, before the layouts that read the row twice. Whole vectors with the
        # first pass taking the slice in 4 parts as it lands, one pass (Welford) first: a group's blocks wait at its
        # barriers with their memory idle, so the pass before the first barrier is what overlaps (GroupNorm on the
        # H100: 6.44 ms online in 4 parts, 6.86 two-pass in 4 parts, 7.17 two-pass whole)
        two, one = _big_row_groups(row_bytes, 2), _big_row_groups(row_bytes, 1)
        big = [(SMS * 2 // two, t) for t in BIG_ROW_THREADS] + ([(SMS // one, 256)] if one >= 2 else [])
        s_big = Strategy(
            "cuda-rows-grid",
            f"Keep each row on chip across a group of {big[0][0]} resident blocks of one cooperative grid (the row is "
            f"too long for a cluster; {two} rows fit on chip at once), a slice each in "
            f"shared memory, so the row is read once and written once; {_what(p)} merged through a global "
            "workspace, a row's blocks waiting on its counter.",
            [*(CudaParams("grid", vec=wide, threads=t, slices=s, mode=m, buffers=1, chunks=4) for m in sorted(modes)
               for s, t in big if wide > 1),
             *(CudaParams("grid", vec=v, threads=t, slices=s, mode=m, buffers=1) for m in sorted(modes, reverse=True)
               for s, t in big for v in (wide // 2, wide))])
        return [s_big, *order]
    return order


def _strided_fits(p: Program) -> bool:
    try:
        return strided_refusal(p) is None
    except NotExpressible:  # a reduction no accumulator expresses
        return False


def _big_row_groups(row_bytes: int, per_sm: int) -> int:
    """Rows on chip at once when each of per_sm blocks on every SM holds up to 200 KB / per_sm of one."""
    return SMS * per_sm * (200 * 1024 // per_sm) // row_bytes


def _fast_math_matters(p: Program) -> bool:
    """Does any op of the program go through the math that FB_FAST replaces (exp, log, division, tanh, sigmoid)?"""
    fast = ("fb_exp(", "fb_log(", "fb_div(", "fb_tanh(", "fb_sigmoid(")
    for e in walk(p.out):
        if isinstance(e, Op):
            try:
                code = op_code(e.name, ["x"] * max(len(e.args), 4), e.attrs)
            except NotExpressible:  # an op the templates cannot express: the render says so
                return True
            if any(f in code for f in fast):
                return True
    return False


def _bytes(dtype: str) -> int:
    return {"float16": 2, "bfloat16": 2, "float64": 8, "int64": 8}.get(dtype, 4)


def _slices(rows: int) -> list[int]:
    """Blocks per row so that rows * slices fills the GPU two to four times over."""
    want = max(1, (4 * SMS) // max(rows, 1))
    cands = sorted({max(2, want), max(2, want // 2), max(2, want * 2)})
    return [s for s in cands if s <= 1024]
