"""Every CUDA parameter set the catalog would propose for a problem, built and timed directly (no harness): a
development tool to see which templates reach the floor before spending a search on them.

    python3 bench/template_sweep.py out/kb-suite/level1_23_Softmax.py [more problems] [--layout cluster] [--max 24]

Per parameter set: does it match the reference on the problem's own inputs (the judge's rule: as close to the
float64 oracle as eager is, give or take the harness's tolerance, atol scaled to a small output's magnitude; where the
oracle is out of reach, allclose to eager), the median of CUDA-event timings with L2 flushed, and
% of the roofline floor (bytes of inputs + outputs / --bandwidth). These numbers are exploration, not claims: what a
PR or the bench table reports comes from the harness (fresh inputs, several trials, a separate process).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

import torch

from runner.catalog.codegen.cuda import CudaParams
from runner.harness import oracle as oracles
from runner.harness import verify
from runner.harness.build import build_many
from runner.harness.problem import build_model, load, make_inputs, strict_fp32
from runner.harness.procs.abi import KernelLibrary, as_tensor_args
from runner.harness.timing import Timer, TimerConfig
from runner.pipeline import problem_from_file
from runner.proposers.catalog import CatalogProposer
from runner.search.types import ProblemContext

log = logging.getLogger("template_sweep")


def parse_params(text: str) -> CudaParams:
    """`layout=split,vec=4,threads=512,slices=16,unroll=4`: any CudaParams fields, the others at their defaults."""
    fields = {f.name: f.type for f in dataclasses.fields(CudaParams)}
    kw: dict[str, object] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"--param: no field {key!r} (fields: {', '.join(fields)})")
        kw[key] = value == "true" if fields[key] == "bool" else int(value) if fields[key] == "int" else value
    return CudaParams(**kw)  # type: ignore[arg-type]


def kernel_times_us(fn, calls: int = 5) -> dict[str, float]:
    """GPU microseconds per call of every kernel (and memset) `fn` launches, by name, from torch.profiler over
    `calls` calls with L2 flushed before each (the flush's own fill kernel left out)."""
    from torch.profiler import ProfilerActivity, profile

    timer = Timer("cuda")
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            timer.flush()
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for ev in prof.key_averages():
        name = ev.key
        total = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if "FillFunctor" in name or not total or ev.count < calls:
            continue  # the flush (zero_), host-side rows
        out[name] = total / calls
    return out


def sweep(path: Path, layouts: set[str] | None, limit: int, bandwidth: float,
          explicit: list[CudaParams] | None = None, repeat: int = 1, compiled: bool = False,
          kernels: bool = False) -> list[dict]:
    prop = CatalogProposer()
    ctx = ProblemContext(name=path.stem, reference_source=path.read_text(), backend="cuda")
    pat = prop.pattern(ctx)
    if pat.program is None:
        return [{"problem": path.stem, "label": f"unsupported: {pat.reason}"}]
    params = explicit or [p for s in prop.strategies(ctx) for p in s.params
                          if layouts is None or p.layout in layouts][:limit]
    cands = [prop.candidate(ctx, pat, p) for p in params]
    built = build_many(cands, cuda_arch="sm_90", jobs=16)

    problem = load(problem_from_file(path))
    model = build_model(problem, problem.model_cls, 0, "cuda")
    inputs = make_inputs(problem, 1234, shape_set=0, randn=None, device="cuda")
    with torch.no_grad():
        ref = model(*inputs)
    atol, rtol = verify.tolerance_for(ref.dtype, problem.spec.atol, problem.spec.rtol)  # per output dtype, as the judge
    atol = verify.effective_atol(atol, verify.magnitude(ref))
    model64, _ = oracles.oracle_model(model)
    (ref64,), _ = oracles.oracle_outputs(model64, inputs, [ref])
    del model64
    nbytes = sum(t.numel() * t.element_size() for t in [*inputs, ref] if isinstance(t, torch.Tensor))
    floor_ms = nbytes / bandwidth * 1e3
    extra = list(model.state_dict().values())
    timer = Timer("cuda", TimerConfig(warmup=3, min_reps=10, max_reps=30, max_seconds=3))
    # one output buffer and one set of inputs for every candidate: the candidates then differ in their kernels only
    out = torch.empty_like(ref)
    args = as_tensor_args(inputs, "cuda") + extra
    stream = torch.cuda.current_stream().cuda_stream
    rows = [{"problem": path.stem, "label": "torch eager", "ok": True, "fn": lambda: model(*inputs), "ms": []}]
    if compiled:
        cm = torch.compile(model)
        with torch.no_grad():
            cm(*inputs)
        rows.append({"problem": path.stem, "label": "torch.compile", "ok": True, "fn": lambda: cm(*inputs), "ms": []})
    for c, p in zip(cands, params, strict=True):
        b = built[c.id]
        row = {"problem": path.stem, "label": p.label(), "ok": False, "fn": None, "ms": []}
        rows.append(row)
        if b.library is None:
            row["label"] += " (build failed: " + b.info.log.strip().splitlines()[-1][:80] + ")"
            continue
        lib = KernelLibrary(b.library)
        out.fill_(float("nan") if ref.is_floating_point() else -1)
        try:
            lib(args, [out], stream)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a failing candidate is a row, not the end of the sweep
            row["label"] += f" ({type(exc).__name__}: {str(exc)[:80]})"
            continue
        row["ok"] = (verify.compare_to_oracle(ref, ref64, out, atol, rtol, 0) if ref64 is not None else
                     verify.compare_values(ref, out, atol, rtol, 0)).passed
        row["fn"] = lambda lib=lib: lib(args, [out], stream)
    for _ in range(repeat):  # interleaved passes: a drift in time shows as a change between a row's passes
        for row in rows:
            if row["fn"] is not None:
                row["ms"].append(timer.measure(row["fn"]).median_ms)
    for row in rows:
        if kernels and row["fn"] is not None:
            with torch.no_grad():
                row["kernels_us"] = kernel_times_us(row["fn"])
        row.pop("fn")
        row["median_ms"] = min(row["ms"]) if row["ms"] else None
    for r in rows:
        r["pct_floor"] = 100 * floor_ms / r["median_ms"] if r.get("median_ms") else None
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", nargs="+", type=Path)
    ap.add_argument("--layout", action="append", help="only these layouts (flat, bcast, rows, columns, split, cluster, grid)")
    ap.add_argument("--max", type=int, default=24, help="parameter sets per problem, in the catalog's order")
    ap.add_argument("--param", action="append", type=parse_params,
                    help="time these parameter sets instead of the catalog's (layout=split,vec=4,slices=16,...)")
    ap.add_argument("--repeat", type=int, default=1, help="interleaved timing passes over all the sets (the least is kept)")
    ap.add_argument("--compile", action="store_true", help="time torch.compile of the reference too")
    ap.add_argument("--kernels", action="store_true",
                    help="also each kernel's GPU time per call (torch.profiler), under each row")
    ap.add_argument("--bandwidth", type=float, default=3.01e12, help="bytes/s for the floor (the H100's copy rate)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    strict_fp32()
    print_rows = []
    for path in args.problems:
        print_rows += sweep(path, set(args.layout) if args.layout else None, args.max, args.bandwidth, args.param, args.repeat,
                            args.compile, args.kernels)
        torch.cuda.empty_cache()
    sys.stdout.write(f"{torch.cuda.get_device_name()}\n| problem | parameters | matches | median ms (least of passes) "
                     "| % floor | each pass |\n| --- | --- | --- | ---: | ---: | --- |\n")
    for r in print_rows:
        ms = f"{r['median_ms']:.4g}" if r.get("median_ms") else "-"
        pct = f"{r['pct_floor']:.0f}%" if r.get("pct_floor") else "-"
        each = " ".join(f"{m:.4g}" for m in r["ms"])
        sys.stdout.write(f"| {r['problem']} | {r['label']} | {'yes' if r.get('ok') else 'NO'} | {ms} | {pct} | {each} |\n")
        for name, us in (r.get("kernels_us") or {}).items():
            sys.stdout.write(f"|  | {us:.1f} us: {name[:110]} | | | | |\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
