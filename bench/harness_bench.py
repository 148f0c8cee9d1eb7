"""Measure the harness itself and write <out>/{results.json,README.md} (bench/results/<gpu>-harness/).

    python bench/harness_bench.py --out DIR [--problems KERNELBENCH_DIR] [--parts builds,overhead,baselines]

- builds: seconds per candidate build, fast format (nvcc, no torch headers) and KernelBench format (load_inline),
  serial and in parallel, over distinct kernels (nothing cached).
- overhead: the harness's own seconds per candidate (process start, load, verify, time) on a tiny problem, where
  the kernel's own run time is negligible.
- baselines: eager and torch.compile (median, IQR, n) and the roofline floor for every problem file in a folder
  (KernelBench level1/level2 files from a local checkout; none are committed here).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from runner.contract import Candidate, ProblemSpec
from runner.harness import build as builder
from runner.harness.config import HarnessConfig
from runner.harness.evaluator import Evaluator

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("bench")

FAST_TEMPLATE = r"""
#include "fusebot.h"
#include <cuda_runtime.h>
__global__ void scale_relu_{K}(const float* x, const float* b, float* y, long long n, long long cols) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) { float v = x[i] * 2.0f + b[i % cols]; y[i] = v < 0.0f ? 0.0f : v; }
}
FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  long long n = in[0].shape[0] * in[0].shape[1], cols = in[0].shape[1];
  scale_relu_{K}<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(
      (const float*)in[0].data, (const float*)in[1].data, (float*)out[0].data, n, cols);
  return (int)cudaGetLastError();
}
"""

INLINE_TEMPLATE = r'''
import time, torch
from torch.utils.cpp_extension import load_inline
cuda = r"""
#include <torch/extension.h>
__global__ void k{K}(const float* x, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] * {K}.0f; }
torch::Tensor f(torch::Tensor x) { auto y = torch::empty_like(x); long long n = x.numel();
  k{K}<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n); return y; }
"""
t0 = time.monotonic()
load_inline(name="bench_inline_{K}", cpp_sources="torch::Tensor f(torch::Tensor x);", cuda_sources=cuda,
            functions=["f"], verbose=False)
print(time.monotonic() - t0)
'''


def fast_candidate(k: int) -> Candidate:
    src = FAST_TEMPLATE.replace("{K}", str(k))  # distinct sources (kernel names), the same function
    return Candidate(id=f"build-{k}", format="fast", backend="cuda", sources={"kernel.cu": src})


def stats(xs: list[float]) -> dict:
    return {"median_s": statistics.median(xs), "min_s": min(xs), "max_s": max(xs), "n": len(xs), "samples_s": xs}


def bench_builds(n: int, inline_serial: int, inline_parallel: int, arch: str) -> dict:
    out: dict = {}
    with tempfile.TemporaryDirectory() as cache:
        serial = [builder.build(fast_candidate(k), cuda_arch=arch, cache_dir=Path(cache)) for k in range(n)]
        assert all(b.info.ok for b in serial), [b.info.log for b in serial if not b.info.ok][:1]
        out["fast_serial"] = stats([b.info.seconds for b in serial])
        t0 = time.monotonic()
        par = builder.build_many([fast_candidate(1000 + k) for k in range(n)], cuda_arch=arch, cache_dir=Path(cache))
        wall = time.monotonic() - t0
        assert all(b.info.ok for b in par.values())
        out["fast_parallel"] = {**stats([b.info.seconds for b in par.values()]), "wall_s": wall, "jobs": os.cpu_count()}
        t0 = time.monotonic()
        again = builder.build(fast_candidate(0), cuda_arch=arch, cache_dir=Path(cache))
        out["fast_cached_s"] = time.monotonic() - t0 if again.info.cached else None
    log.info("fast builds: serial median %.2f s, parallel wall %.1f s", out["fast_serial"]["median_s"], wall)

    def inline(k: int) -> float:
        with tempfile.TemporaryDirectory() as ext:
            script = Path(ext) / "b.py"
            script.write_text(INLINE_TEMPLATE.replace("{K}", str(k)))
            t0 = time.monotonic()
            subprocess.run([sys.executable, str(script)], check=True, capture_output=True,
                           env={**os.environ, "TORCH_EXTENSIONS_DIR": ext})
            return time.monotonic() - t0

    if inline_serial:
        out["inline_serial"] = stats([inline(k) for k in range(inline_serial)])
        log.info("load_inline serial median %.1f s", out["inline_serial"]["median_s"])
    if inline_parallel:
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=inline_parallel) as pool:
            secs = list(pool.map(inline, range(100, 100 + inline_parallel)))
        out["inline_parallel"] = {**stats(secs), "wall_s": time.monotonic() - t0, "jobs": inline_parallel}
        log.info("load_inline parallel wall %.1f s", out["inline_parallel"]["wall_s"])
    return out


def bench_overhead(n: int, arch: str) -> dict:
    spec = ProblemSpec(name="scale_relu", path=str(ROOT / "tests/fixtures/problems/scale_relu.py"),
                       second_inputs="get_second_inputs")
    with tempfile.TemporaryDirectory() as cache, Evaluator(
        spec, backend="cuda", config=HarnessConfig(compile_baseline=False, cache_dir=Path(cache))
    ) as ev:
        ev.baselines(), ev.roofline(), ev.reference_kernels()  # once per problem, not per candidate
        cands = [fast_candidate(2000 + k) for k in range(n)]
        t0 = time.monotonic()
        verdicts = ev.evaluate_many(cands)
        wall = time.monotonic() - t0
    assert all(v.accepted for v in verdicts), [v.reasons for v in verdicts if not v.accepted][:1]
    per_stage = {s: statistics.median(v.stage_seconds.get(s, 0.0) for v in verdicts)
                 for s in ("build", "load", "verify", "time")}
    return {"candidates": n, "wall_s": wall, "harness_seconds": stats([v.harness_seconds for v in verdicts]),
            "stage_median_s": per_stage, "timing_n_median": statistics.median(v.timing.n for v in verdicts),
            "kernel_median_ms": statistics.median(v.timing.median_ms for v in verdicts),
            "environment": verdicts[0].environment.model_dump()}


def bench_baselines(problem_dir: Path, deadline_s: float) -> list[dict]:
    rows = []
    files = sorted(problem_dir.glob("level*/*.py"))
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as cache:
        for f in files:
            if time.monotonic() - start > deadline_s:
                rows.append({"problem": f"{f.parent.name}/{f.stem}", "skipped": "time budget"})
                continue
            spec = ProblemSpec(name=f.stem, path=str(f))
            t0 = time.monotonic()
            try:
                with Evaluator(spec, backend="cuda", config=HarnessConfig(cache_dir=Path(cache))) as ev:
                    b, r = ev.baselines(), ev.roofline()
                    env = ev.environment()
            except Exception as exc:  # noqa: BLE001 - one broken problem does not stop the table
                rows.append({"problem": f"{f.parent.name}/{f.stem}", "error": f"{type(exc).__name__}: {exc}"[:500]})
                continue
            row = {"problem": f"{f.parent.name}/{f.stem}", "eager": b.eager.model_dump(),
                   "compile": b.compile.model_dump() if b.compile else None, "compile_error": b.compile_error,
                   "roofline": r.model_dump(), "gpu": env.gpu, "seconds": time.monotonic() - t0}
            rows.append(row)
            log.info("%s: eager %.3f ms, compile %s ms, floor %.3f ms", row["problem"], b.eager.median_ms,
                     f"{b.compile.median_ms:.3f}" if b.compile else "-", r.floor_ms)
    return rows


def markdown(res: dict) -> str:
    env = res.get("environment", {})
    lines = [f"# Harness measurements on {env.get('gpu', '?')}", "",
             f"torch {env.get('torch')}, CUDA {env.get('cuda')}, driver {env.get('driver')}, "
             f"fusebot {env.get('fusebot')}; measured {res['date']} by `bench/harness_bench.py` at commit "
             f"{res.get('commit', 'unknown')}.", ""]
    b = res.get("builds")
    if b:
        lines += ["## Build seconds per candidate (distinct kernels, nothing cached)", "",
                  "| format | mode | n | median s | min s | max s | wall s |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for key, fmt, mode in (("fast_serial", "fast (nvcc, C ABI)", "serial"),
                               ("fast_parallel", "fast (nvcc, C ABI)", "parallel"),
                               ("inline_serial", "KernelBench (load_inline)", "serial"),
                               ("inline_parallel", "KernelBench (load_inline)", "parallel")):
            if key in b:
                s = b[key]
                wall = f"{s['wall_s']:.1f}" if "wall_s" in s else ""
                lines.append(f"| {fmt} | {mode} | {s['n']} | {s['median_s']:.2f} | {s['min_s']:.2f} | "
                             f"{s['max_s']:.2f} | {wall} |")
        if b.get("fast_cached_s") is not None:
            lines.append(f"\nA cached fast build (same source, flags, compiler, arch): {b['fast_cached_s'] * 1e3:.1f} ms.")
        lines.append("")
    o = res.get("overhead")
    if o:
        st = o["stage_median_s"]
        lines += ["## Harness overhead per candidate", "",
                  f"{o['candidates']} distinct fast-format candidates on a 64x256 problem (the kernel itself runs "
                  f"{o['kernel_median_ms'] * 1e3:.1f} us): median {o['harness_seconds']['median_s']:.2f} s per "
                  f"candidate (build {st['build']:.2f}, process start + load {st['load']:.2f}, 7 verified trials "
                  f"{st['verify']:.2f}, timing with n={o['timing_n_median']:.0f} and the wall-clock cross-check "
                  f"{st['time']:.2f}); {o['wall_s']:.1f} s wall for all {o['candidates']} including parallel builds.", ""]
    rows = res.get("baselines")
    if rows:
        lines += ["## Baselines (fp32, TF32 off, L2 flushed, median of n)", "",
                  "| problem | eager ms (IQR, n) | torch.compile ms (IQR, n) | floor ms | eager % of floor "
                  "| compile % of floor |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in rows:
            if "eager" not in r:
                lines.append(f"| {r['problem']} | {r.get('error') or r.get('skipped')} | | | | |")
                continue
            e, c, f = r["eager"], r["compile"], r["roofline"]["floor_ms"]
            cs = f"{c['median_ms']:.3f} ({c['iqr_ms']:.3f}, {c['n']})" if c else (r["compile_error"] or "-")[:60]
            lines.append(f"| {r['problem']} | {e['median_ms']:.3f} ({e['iqr_ms']:.3f}, {e['n']}) | {cs} | {f:.3f} | "
                         f"{100 * f / e['median_ms']:.0f}% | {100 * f / c['median_ms']:.0f}% |" if c else
                         f"| {r['problem']} | {e['median_ms']:.3f} ({e['iqr_ms']:.3f}, {e['n']}) | {cs} | {f:.3f} | "
                         f"{100 * f / e['median_ms']:.0f}% | - |")
        bw = next((r["roofline"] for r in rows if "roofline" in r), None)
        if bw:
            lines += ["", f"Floor = bytes the problem must move (inputs + parameters + outputs) / "
                          f"{bw['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s ({bw['bandwidth_source']}). "
                          "For matmul and convolution problems the floor is not the limit (compute-bound)."]
    return "\n".join(lines) + "\n"


def git_commit() -> str:
    """The checkout's commit, named in the results: the code that produced them."""
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--problems", type=Path)
    ap.add_argument("--parts", default="builds,overhead,baselines")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--inline-serial", type=int, default=2)
    ap.add_argument("--inline-parallel", type=int, default=16)
    ap.add_argument("--baseline-budget-s", type=float, default=420)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    parts = set(args.parts.split(","))
    res: dict = {"date": time.strftime("%Y-%m-%d"), "arch": arch, "commit": git_commit()}
    args.out.mkdir(parents=True, exist_ok=True)
    if "overhead" in parts:
        res["overhead"] = bench_overhead(8, arch)
        res["environment"] = res["overhead"]["environment"]
    if "builds" in parts:
        res["builds"] = bench_builds(args.n, args.inline_serial, args.inline_parallel, arch)
    if "baselines" in parts and args.problems:
        res["baselines"] = bench_baselines(args.problems, args.baseline_budget_s)
        if "environment" not in res and res["baselines"]:
            res["environment"] = {"gpu": res["baselines"][0].get("gpu"), "torch": torch.__version__,
                                  "cuda": torch.version.cuda}
    (args.out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    (args.out / "README.md").write_text(markdown(res))
    sys.stdout.write(markdown(res))


if __name__ == "__main__":
    main()
