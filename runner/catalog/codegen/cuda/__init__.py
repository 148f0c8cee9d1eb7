"""CUDA-C templates (fp32, fp16, bf16; loads widened to fp32, fp32 accumulation), one module per layout:

- flat.py: `flat` (elementwise, V-wide vector accesses, U vectors per thread in flight) and `bcast` (elementwise with
  inputs broadcast along at most three runs of dims, indices stepped forward per thread);
- rows.py: `rows`, a warp or a block per row whose reduced dims are innermost (I = 1);
- regs.py: `regs`, short rows held in registers, a group of 2-32 lanes (or the block) per row, several rows a block;
- columns.py: `columns` (a reduced middle dim, threads across the contiguous inner dim) and `strided` (the same where
  the inner dim is not whole vectors);
- rope.py: `rope`, a rotary position embedding (runner.catalog.rope) over all its outputs in one launch;
- split.py: `split`, few long rows, several blocks per row, partials through a workspace;
- cluster.py: `cluster`, a row held on chip across a thread-block cluster (sm_90), partials through distributed
  shared memory; grid.py: `grid`, the same on a group of co-resident blocks of one cooperative grid; both build on
  onchip.py (the slice of a row in shared memory);
- common.py: the helpers they share; prelude.py: the fixed head of every source; params.py: CudaParams.

`render(program, params)` here picks the layout's module and puts the shared head before its kernels. Every size
comes from the call's tensors except those the source fixes in its third line, `// fusebot-sizes: in0=d0,1024`
(runner/catalog/sizes.py): the host code refuses a call with other values of those, so a drop-in guards them.
"""

from __future__ import annotations

from runner.catalog.codegen.common import NotExpressible, signature
from runner.catalog.codegen.cuda import cluster, columns, flat, grid, regs, rope, rows, split
from runner.catalog.codegen.cuda.common import UNIT_RUNS, ctype_of, rowblock_inputs, workspace_code
from runner.catalog.codegen.cuda.flat import broadcast_view
from runner.catalog.codegen.cuda.params import CudaParams
from runner.catalog.codegen.cuda.prelude import FAST, PRELUDE
from runner.catalog.codegen.head import MATH, args_struct, setup_code
from runner.catalog.codegen.index import index_fns
from runner.catalog.codegen.used import accumulators
from runner.catalog.ir import Program
from runner.catalog.sizes import sizes_line

__all__ = ["FAST", "CudaParams", "NotExpressible", "broadcast_view", "render", "rowblock_inputs", "strided_refusal",
           "workspace_code"]

strided_refusal = columns.strided_refusal

LAYOUTS = {"flat": flat.render_flat, "bcast": flat.render_bcast, "rows": rows.render_rows, "regs": regs.render_regs,
           "columns": columns.render_columns, "strided": columns.render_strided, "split": split.render_split,
           "cluster": cluster.render_cluster, "grid": grid.render_grid}


def render(p: Program, params: CudaParams, abi_offset: int = 0) -> str:
    if p.has_totals and params.layout not in ("rows", "regs"):
        raise NotExpressible("a reduction over every row (a mean of per-row losses): the rows and regs layouts "
                             "finish it")
    out_t = ctype_of(p.out_dtype)
    for inp in p.inputs:
        ctype_of(inp.dtype)
    if params.vec not in (1, 2, 4, 8) or params.threads % 32 or not 32 <= params.threads <= 1024:
        raise NotExpressible(f"vector width {params.vec} / {params.threads} threads")
    if params.layout == "rope":  # its own argument block and set-up (every size the captured one)
        return rope.render_rope(p, params, abi_offset)
    head = [f"// fusebot catalog: {params.label()}", f"// {signature(p)}", sizes_line(p, abi_offset, params.layout),
            PRELUDE]
    if params.fast_math:
        head.append(FAST)
    layout = LAYOUTS.get(params.layout)
    if layout is None:
        raise NotExpressible(f"layout {params.layout}")
    setup, body = setup_code(p, abi_offset, params.layout), layout(p, params, out_t)
    used = setup + body  # only the accumulators and index functions these use
    head += [MATH, accumulators(used), args_struct(p),
             index_fns(used, p, params.layout).replace("FB_HD", "static __device__ __forceinline__"), setup]
    if rowblock_inputs(p):
        head.append(UNIT_RUNS)
    return "\n".join(head) + body
