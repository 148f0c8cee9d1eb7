"""CUDA template `regs`: short rows held in registers, several rows per block.

A group of G threads owns a row (G = 2-32 lanes of one warp, merged by shuffles within the group; or G = the whole
block, merged through shared memory), each thread K = ceil(R / (G * V)) vectors of V elements at positions
(q * G + lane) * V. The row length R is fixed when the source is rendered (K is a compile-time constant, so the
vectors live in registers): the row is read from global memory once, every pass of the program (a mean, then the
squared deviations; a max, then the sum of exponentials) runs over the registers, and the output is written once.
With two buffers (the default, where a second copy fits MAX_HELD_BYTES: `loads_ahead`) one wave of resident blocks
walks the rows, and a group loads its next row into a second set of registers before this row's reductions: two rows'
loads in flight a thread instead of one, the load of a row no longer waiting on the reductions of the one before.
The number of rows comes from the call's shapes. The host refuses another row length (the source says so in its
`// fixed sizes:` line), and takes the scalar kernel, which reads the row from memory in every pass, where a pointer
does not align to V elements.
"""

from __future__ import annotations

from dataclasses import replace

from runner.catalog import skipping
from runner.catalog.codegen.common import NotExpressible, float_literal, full_output, plan_passes, red_kinds, row_result, stored
from runner.catalog.codegen.cuda.common import (
    Loads,
    More,
    align_check,
    ctype_of,
    emitter,
    forward,
    row_bases,
    spaced,
    value_decls,
    vec_inputs,
)
from runner.catalog.codegen.cuda.params import CudaParams
from runner.catalog.codegen.cuda.totals import Totals
from runner.catalog.ir import Op, Program, children
from runner.catalog.ir import walk as walk_expr
from runner.catalog.ops import COSTLY, ROUNDINGS

# per-thread registers a row may take: vectors of the held inputs (K * V elements each, stored in their own dtype)
MAX_HELD_BYTES = 256
# vector positions per thread of the scalar kernel's loops beyond which they are not unrolled
MAX_UNROLL = 32

SUPPORT = r"""
// a merge across the G lanes of a group (G a power of two <= 32, groups aligned in their warp): every lane of the warp
// takes part, rows past the last included, so the full-mask shuffles never diverge
template <int G, typename A> __device__ __forceinline__ void fb_group_reduce(A& acc) {
#pragma unroll
  for (int off = G / 2; off > 0; off >>= 1) { A o = fb_shfl_xor(acc, off); acc.merge(o); }
}
"""


class RegLoads(Loads):
    """Loads of the `regs` kernels: a held input's element is lane j of register vector q (x{k}[q]); the rest as
    `Loads` reads them (row vectors V-wide at the vector's in-row position, others by index)."""

    def __init__(self, p: Program, held: set[int], vec_in: set[int]):
        super().__init__(p, vec_in)
        self.held = held

    def __call__(self, k: int) -> str:
        if k in self.held:
            return f"fb_f(x{k}[q].v[j])"
        return super().__call__(k)


def row_length(p: Program) -> int:
    """R, the captured row length a `regs` source is specialised on."""
    return p.split()[1]


def regs_refusal(p: Program, params: CudaParams) -> str | None:
    """Why `regs` cannot express the program with these parameters (None when it can)."""
    if not p.is_row:
        return "regs is for row programs"
    _, R, inner = p.split()
    if inner != 1:
        return "regs needs the reduced dims innermost"
    V, T, G = params.vec, params.threads, params.group or params.threads
    if G not in (2, 4, 8, 16, 32) and G != T:
        return f"a row's group of {G} threads is not a power of two up to a warp, nor the block"
    if T % G:
        return f"{T} threads do not hold whole groups of {G}"
    if R % V:
        return f"rows of {R} are not whole vectors of {V}"
    inputs = held_bytes(p, params)[0]
    if inputs > MAX_HELD_BYTES:
        return f"{inputs} bytes of registers a thread for its share of the row (at most {MAX_HELD_BYTES})"
    return None


SIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def held_bytes(p: Program, params: CudaParams) -> tuple[int, int]:
    """A thread's bytes of registers for its share of a row: its held inputs' vectors, and those plus a float per
    element that a later pass reuses (a softmax's exponential), the estimate the layouts are sized by."""
    R, V = row_length(p), params.vec
    K = -(-R // ((params.group or params.threads) * V))
    inputs = sum(SIZE.get(p.inputs[k].dtype, 4) for k in vec_inputs(p, ("full",)))
    return K * V * inputs, K * V * (inputs + (4 if red_kinds(p) else 0))


def loads_ahead(p: Program, params: CudaParams) -> bool:
    """Whether the vector kernel loads its next row while it reduces this one (`buffers` 2): where it holds inputs
    and a second copy of them fits MAX_HELD_BYTES beside the row's own registers (else the copy would cost the SM
    blocks: fp32 rows of 1024 a warp, 105 registers a thread, 137 with it, 2 blocks of 256 an SM to 1)."""
    inputs, total = held_bytes(p, params)
    return params.buffers == 2 and inputs > 0 and total + inputs <= MAX_HELD_BYTES


def render_regs(p: Program, params: CudaParams, out_t: str) -> str:
    why = regs_refusal(p, params)
    if why:
        raise NotExpressible(why)
    V, T = params.vec, params.threads
    G = params.group or T
    R = row_length(p)
    # with a causal mask's limit the kernel stops there: before it the mask keeps every element, so it is not tested
    plan = plan_passes(replace(p, out=skipping.inside(p, p.out)) if p.limit is not None else p, params.mode)
    tot = Totals(p, plan)
    held = vec_inputs(p, ("full",))
    vec_in = vec_inputs(p, ("rowvec", "rowper"))
    kernels = [SUPPORT, tot.support(out_t)]
    for v in sorted({1, V}):
        kernels.append(_kernel(p, plan, out_t, v, T, G, R, held if v > 1 else set(), vec_in if v > 1 else set(),
                               ahead=v > 1 and loads_ahead(p, params)))
    ok = align_check(p, held | vec_in, out_t, V, "")
    gpb = T // G
    # a kernel that loads its next row ahead walks its rows with one wave of resident blocks, so that a block has a
    # next row to load while it reduces this one
    wave = (f"\n    {{ static const long long wave = fb_wave(fb_regs_v{V}, {T}); if (blocks > wave) blocks = wave; }}"
            if V > 1 and loads_ahead(p, params) else "")
    call = f"fb_regs_v{V}<<<(unsigned)blocks, {T}, 0, s>>>(a{tot.arg()});"
    call = f"if (wide) {{{wave}\n    {call}\n  }}" if wave else f"if (wide) {call}"
    launch = f"""  if (a.I != 1 || a.R != {R}LL) {{
    snprintf(fb_err, sizeof fb_err, "compiled for rows of {R} elements, called with %lld x %lld", a.R, a.I);
    return 1;
  }}
  if (a.O == 0) return 0;
{tot.prepare()}  long long blocks = (a.O + {gpb - 1}) / {gpb};
  if (blocks > 0x7fffffffLL) blocks = 0x7fffffffLL;
  const bool wide = {V} > 1 && ({ok});
  {call}
  else fb_regs_v1<<<(unsigned)blocks, {T}, 0, s>>>(a{tot.arg()});{tot.finish()}"""
    return "".join(kernels) + forward(launch)


def _kernel(p: Program, plan, out_t: str, v: int, T: int, G: int, R: int, held: set[int], vec_in: set[int],
            ahead: bool = False) -> str:
    """fb_regs_v{v}: `held` inputs loaded into registers once (none in the scalar kernel: every pass reads memory).
    `ahead`: the group's next row (a grid's worth of rows further) is loaded into a second set of registers (n{k})
    before this row's reductions, so a thread keeps two rows' loads in flight instead of waiting on each row's."""
    K = -(-R // (G * v))
    unroll = "#pragma unroll" if held or K <= MAX_UNROLL else "#pragma unroll 4"
    loads = RegLoads(p, held, vec_in)
    pos = f"const int r0 = (q * {G} + lane) * {v};"  # (in a row: 32-bit compares and offsets)

    skip = p.limit is not None  # a causal mask: nothing at or past the row's limit is read (runner.catalog.skipping)

    def limit() -> str:
        """`lim`, the row's limit from its own coordinates (a causal mask: the row's index plus the slice's offset)."""
        le = emitter(Loads(p, set()))
        le.prefix = "l"
        code = le(p.limit)
        found = "\n      ".join(le.lines)
        return f"""    int lim;
    {{ const long long r = 0, flat = o * {R}LL; (void)r; (void)flat;
      {found}
      const long long l = (long long)({code}); lim = (int)(l < 0 ? 0 : (l > {R}LL ? {R}LL : l)); }}
"""

    def walk(body: str, beyond: str = "", edge: str = "") -> str:
        """`body` at each of the thread's vector positions r0 of its row: where there is a limit, those wholly before
        it (`edge`, the body that stops at the limit, for the one vector across it; `beyond` past it)."""
        if skip and edge:
            inside = f"""if (live && r0 + {v} <= lim) {{
        {body}
      }} else if (live && r0 < lim) {{
        {edge}
      }}"""
        else:
            inside = f"""if (live && {"r0 < lim" if skip else f"r0 < {R}"}) {{
        {body}
      }}"""
        other = f""" else if (live && r0 < {R}) {{
        {beyond}
      }}""" if skip and beyond else ""
        return f"""{unroll}
    for (int q = 0; q < {K}; ++q) {{
      {pos}
      {inside}{other}
    }}"""

    def fills(x: str) -> str:
        return " ".join(f"{x}{k}[q] = fb_ldv<{ctype_of(p.inputs[k].dtype)}, {v}>((const {ctype_of(p.inputs[k].dtype)}*)"
                        f"a.in[{k}] + o * {R}LL + r0);" for k in sorted(held))

    def regs(x: str, init: str = "") -> str:
        return " ".join(f"FbVec<{ctype_of(p.inputs[k].dtype)}, {v}> {x}{k}[{K}]{init};" for k in sorted(held))

    def fetch(row: str) -> str:
        """The loads of `row`'s held vectors into n{k} (none past the last row, nor past that row's limit)."""
        return f"""    {{ const long long o = {row}; const bool live = o < a.O;
{limit() if skip else ""}{walk(fills("n"))}
    }}"""

    start, parts = "", []
    if held and ahead:
        start = f"""
  {regs("n", " = {}")}
{fetch(f"(long long)blockIdx.x * {T // G} + threadIdx.x / {G}")}"""
        copy = " ".join(f"x{k}[q] = n{k}[q];" for k in sorted(held))
        parts = [f"""    {regs("x")}
{unroll}
    for (int q = 0; q < {K}; ++q) {{ {copy} }}
{fetch(f"row + (long long)gridDim.x * {T // G}")}"""]
    elif held:
        parts = [f"    {regs('x')}\n{walk(fills('x'))}"]
    # a costly value a pass computes per element and a later pass (or the output) needs again (softmax's exp(x - m)):
    # kept in registers where the loops unroll fully, so each element's is computed once
    keep = Kept(plan, K * v) if held else None
    # past the limit every reduction's argument is its identity (skipping.find proved it): not added
    stop = "if (r0 + j >= lim) break;\n          " if skip else ""
    for pno in range(1, plan.passes + 1):
        accs = [x for x in plan.accs if x.pass_no == pno]
        loads.used.clear()
        em = emitter(loads)
        if keep:
            keep.seed(em)
        adds = [f"{x.name}.add({em(x.arg)}, r);" for x in accs]
        if keep:
            adds += keep.stores(em, pno)
        body = "\n          ".join(em.lines + adds)
        decl = " ".join(f"{x.kind} {x.name}; {x.name}.init();" for x in accs)
        red = "\n    ".join(f"fb_group_reduce<{G}>({x.name});" if G <= 32 else f"fb_block_reduce<{x.kind}, {T}>({x.name});"
                             for x in accs)
        lanes = [f'''{loads.vector_decls("(o * a.R + r0)", v) if vec_in else ""}
#pragma unroll
        for (int j = 0; j < {v}; ++j) {{
          const long long r = r0 + j, flat = o * {R}LL + r; (void)flat;
          {b}{body}
        }}''' for b in ("", stop)]
        parts.append(f"""    {decl}
{walk(lanes[0], edge=lanes[1] if skip else "")}
    {red}
    {value_decls(plan, pno)}""")
    loads.used.clear()
    em = emitter(loads)
    if keep:
        keep.seed(em)
    assert plan.out is not None
    more = More(p)
    if full_output(p):
        res = em(stored(plan.out, p.out_dtype))
        more.values(em, plan.more)
        lines = "\n          ".join(em.lines)
        value = f"fb_to<{out_t}>({res})"
        const = f"fb_to<{out_t}>({float_literal(p.beyond)})"
        if skip:  # (a vector across the limit: the constant past it; a vector wholly past it: no read, no exp)
            lines = f"if (r0 + j < lim) {{\n            {lines}\n            ov.v[j] = {value};\n          }} else " \
                    f"ov.v[j] = {const};" if em.lines else lines
            value = f"r0 + j < lim ? {value} : {const}" if not em.lines else ""
        past = f"""FbVec<{out_t}, {v}> ov;
#pragma unroll
        for (int j = 0; j < {v}; ++j) ov.v[j] = {const};
        fb_stv<{out_t}, {v}>(({out_t}*)a.out + o * {R}LL + r0, ov);"""
        set_out = f"ov.v[j] = {value};" if value else ""
        out = walk(f"""{loads.vector_decls("(o * a.R + r0)", v) if vec_in else ""}
        FbVec<{out_t}, {v}> ov;{spaced(more.decls(v))}
#pragma unroll
        for (int j = 0; j < {v}; ++j) {{
          const long long r = r0 + j, flat = o * {R}LL + r; (void)flat;
          {lines}
          {set_out}{spaced(more.sets())}
        }}
        fb_stv<{out_t}, {v}>(({out_t}*)a.out + o * {R}LL + r0, ov);{spaced(more.stores(v, f"o * {R}LL + r0"))}""",
                   past if skip else "")
    else:
        em = emitter(Loads(p, set()))
        tot = Totals(p, plan)
        if tot:  # each Total's per-row value to the workspace; fb_totals writes the output
            stores = tot.row_stores(em)
        else:
            res = row_result(p, plan, em)
            more.values(em, plan.more)
            stores = [f"(({out_t}*)a.out)[row] = fb_to<{out_t}>({res});{spaced(more.scalar_stores('row'))}"]
        lines = "\n      ".join(em.lines + stores)
        out = f"""    if (live && lane == 0) {{
      const long long r = 0, flat = o * {R}LL; (void)r; (void)flat;
      {lines}
    }}"""
    passes = "\n".join(([f"    {keep.decls(K, v)}"] if keep and keep.decls(K, v) else []) + parts)
    if skip:
        passes = f"{limit()}{passes}"
    return f"""
// {G} threads a row, {T // G} rows a block; thread `lane` of a group holds the row's vectors at ((q * {G} + lane) * {v})
__global__ void __launch_bounds__({T}) fb_regs_v{v}(FbArgs a{Totals(p, plan).param()}) {{
  const int lane = threadIdx.x % {G};{start}
  for (long long base = (long long)blockIdx.x * {T // G}; base < a.O; base += (long long)gridDim.x * {T // G}) {{
    const long long row = base + threadIdx.x / {G}, o = row, i = 0; (void)i;
    const bool live = row < a.O;
    {row_bases(p)}
{passes}
{out}
  }}
}}
"""


def worth_keeping(e) -> bool:
    """A value worth a register per element rather than computing again: a transcendental inside, or three ops or more,
    a rounding to a half type counting two (a conversion and a shift back: a bf16 causal softmax's scaled and rounded
    score)."""
    ops = [x for x in walk_expr(e) if isinstance(x, Op)]
    return sum(2 if x.name in ROUNDINGS else 1 for x in ops) >= 3 or any(x.name in COSTLY for x in ops)



class Kept:
    """Values a `regs` pass computes for each of a thread's `n` elements and a later pass or the output uses again,
    held in registers kp{m}[q][j] (at most MAX_HELD_BYTES a thread): the largest sub-expressions worth keeping of what
    comes later, computed by the pass that first needs them. A value no later code needs gives its registers to one
    this pass computes from it (a softmax's score, then exp(score - max) in its place), which is then read as a leaf:
    what it was computed from is not needed again."""

    def __init__(self, plan, n: int):
        self.plan, self.n = plan, n
        self.slots: dict = {}  # Expr -> the name of its registers, for values still needed
        self.names: list[str] = []  # every register set declared

    def later_needs(self, pno: int, kept=()) -> set:
        """Every sub-expression the passes after pno and the outputs use, not looking inside a value in `kept` (read
        from its registers)."""
        roots = [x.arg for x in self.plan.accs if x.pass_no > pno] + [e for e in (self.plan.out, *self.plan.more) if e]
        seen: set = set()
        stack = list(roots)
        while stack:
            e = stack.pop()
            if e in seen:
                continue
            seen.add(e)
            if e not in kept:
                stack.extend(children(e))
        return seen

    def seed(self, em) -> None:
        """Values stored by earlier passes read from their registers."""
        for e, name in self.slots.items():
            em.memo[e] = f"{name}[q][j]"

    def stores(self, em, pno: int) -> list[str]:
        """After pass pno's element code: the values it computed that later code needs again, to their registers (a
        kept value no later code needs gives its registers up first)."""
        later = self.later_needs(pno)
        fresh = [e for e in em.memo if e not in self.slots and e in later and isinstance(e, Op) and worth_keeping(e)]
        fresh = [e for e in fresh if not any(e is not f and e in set(walk_expr(f)) for f in fresh)]  # the largest
        needed = self.later_needs(pno, kept={*self.slots, *fresh})
        free = [name for e, name in self.slots.items() if e not in needed]
        self.slots = {e: name for e, name in self.slots.items() if e in needed}
        out = []
        for e in fresh:
            if not free and 4 * self.n * (len(self.names) + 1) > MAX_HELD_BYTES:
                break
            name = free.pop(0) if free else f"kp{len(self.names)}"
            if name not in self.names:
                self.names.append(name)
            out.append(f"{name}[q][j] = {em.memo[e]};")
            self.slots[e] = name
        return out

    def decls(self, K: int, v: int) -> str:
        return " ".join(f"float {name}[{K}][{v}];" for name in self.names)


MAX_ROW = 16384  # the longest row `regs` holds: a block of 1024 threads, a few 16-byte vectors each


def short_row_params(p: Program, max_len: int = MAX_ROW) -> list[CudaParams]:
    """The `regs` parameter sets worth trying for a row program whose rows (innermost, at most max_len elements) fit
    in registers, best guess first: 16-byte vectors (8-byte, then single elements, where R is not whole 16-byte
    vectors); threads sized from the row's R / V vectors: a warp per row with up to 8 vectors a thread, then smaller
    groups (several rows a warp: rows of a few hundred elements), and a whole block per row for long rows, its
    threads R / (V * K) for K = 2, 4, 1, 8 vectors a thread (no thread idle, none holding more than 8); the exact
    two-pass mode first (each pass over registers costs no memory traffic), online where it changes the code. Empty
    where `regs` does not apply."""
    if not p.is_row or p.split()[2] != 1:
        return []
    n = row_length(p)
    if n > max_len:
        return []
    stored = [SIZE.get(p.out_dtype, 4)] if full_output(p) else []  # (a per-row output is written one value a row)
    widest = max([SIZE.get(p.inputs[k].dtype, 4) for k in vec_inputs(p, ("full",))] + stored, default=4)
    V = next(v for v in (16 // widest, 8 // widest, 1) if v >= 1 and n % v == 0)
    shapes = []  # (group, threads): a vector each for every lane, at most 8 a thread
    for G in (32, 16, 8, 4):
        if n >= G * V and -(-n // (G * V)) <= 8:
            shapes += [(G, 256), (G, 128)]
    vectors = -(-n // V)
    for K in (2, 4, 1, 8):  # a block per row: its threads from the row, whole warps, every thread a vector or more
        T = vectors // K // 32 * 32
        if 64 <= T <= 1024 and -(-vectors // T) <= 8 and (0, T) not in shapes:
            shapes.append((0, T))
    if not shapes:  # rows shorter than a vector per lane of the smallest group
        shapes = [(4, 128)]
    # few registers a thread first: a thread holding a share of MAX_HELD_BYTES or more (its inputs' elements, and a
    # float each that a later pass reuses: a softmax's score, then its exponential) runs a block or two an SM, whose
    # loads then wait on its own reductions (170 registers a thread, one block of 256 an SM, for a bf16 row of 2048
    # held by a warp: ptxas -v, sm_90)
    def held(shape: tuple[int, int]) -> int:
        G, T = shape
        return held_bytes(p, CudaParams("regs", vec=V, threads=T, group=G))[1]

    # where the first guess holds too much, the heaviest that fits first: the most bytes in flight a thread, and the
    # fewest threads to merge a row's reductions across. That bf16 row of 2048 (a softmax in fp32), H200, one
    # timing each (bench/template_sweep.py): blocks of 64, 128 and 256 threads per row 0.731, 0.810 and 1.040 ms;
    # a warp per row (384 bytes held) 0.865 ms
    heavy = held(shapes[0]) > MAX_HELD_BYTES
    shapes.sort(key=lambda s: (held(s) > MAX_HELD_BYTES, -held(s) if heavy else 0))
    modes = ["twopass", "online"] if red_kinds(p) & {"var", "lse"} else ["twopass"]
    out = [CudaParams("regs", vec=V, threads=T, group=G, mode=m) for G, T in shapes[:4] for m in modes[:1]]
    out += [CudaParams("regs", vec=V, threads=T, group=G, mode=m) for G, T in shapes[:1] for m in modes[1:]]
    return [q for q in out if regs_refusal(p, q) is None]
