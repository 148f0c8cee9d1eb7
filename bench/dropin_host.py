"""What one call through a generated drop-in costs on the host, beside the same kernel called straight and eager.

For each problem (examples/row_gain.py at a chosen size, the tests' scale_relu fixture), the catalog's first kernel is
written out as a PR ships it (a CPU kernel: its library built here; a CUDA kernel: its cubin and the launch plans of
the call timed), the drop-in imported, and four ways of computing the same output timed, each as the best of
`--rounds` rounds of `--calls` back-to-back calls (CUDA: a synchronize closes each round), in microseconds a call:

- `dropin_us`: the drop-in's forward as a user calls it (no_grad): the guard, the plan lookup, the launch;
- `run_us`: the drop-in's kernel path without the guard (`_run`: output allocation, then the launch; where the
  drop-in makes a call signature's kernel path once, `_Call`, with that made beforehand);
- `raw_us`: the kernel alone, its arguments made once (CPU: `fusebot_forward` through ctypes; CUDA: the plan's
  `cuLaunchKernel` calls with their parameter bytes made once);
- `eager_us`: the original module.

    python bench/dropin_host.py --backend cpu                 # here
    python bench/dropin_host.py --backend cuda                # on a GPU (nvcc makes the cubin)
    python bench/dropin_host.py --backend cpu --profile       # and where the drop-in's microseconds go (cProfile)

Prints the machine (CPU, cores, load average, GPU) and a table; needs fusebot installed (`make test` sets up .venv).
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import importlib.util
import io
import logging
import os
import platform
import pstats
import struct
import sys
import tempfile
import time
from pathlib import Path

import torch

from runner.contract import Candidate, ProblemSpec
from runner.harness.dropin import DROPIN_FILE, HEADER_FILE, REFERENCE_FILE, kernel_filename, shipped
from runner.proposers.catalog import CatalogProposer
from runner.search.types import History, ProblemContext

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("dropin_host")


def row_gain(rows: int, cols: int) -> str:
    """examples/row_gain.py at rows x cols, in KernelBench's names."""
    text = (ROOT / "examples" / "row_gain.py").read_text()
    if "rows, cols = 1024, 512" not in text:
        raise SystemExit("examples/row_gain.py no longer sets `rows, cols = 1024, 512`")
    return text.replace("rows, cols = 1024, 512", f"rows, cols = {rows}, {cols}") + "\nModel = RowGain\n"


def problems(rows: int, cols: int) -> list[tuple[str, str, str]]:
    """(name, reference text, class name)."""
    return [(f"row_gain {rows}x{cols}", row_gain(rows, cols), "RowGain"),
            ("scale_relu 64x256", (ROOT / "tests/fixtures/problems/scale_relu.py").read_text(), "Model")]


def catalog_kernel(reference: str, backend: str) -> Candidate:
    ctx = ProblemContext(name="bench", reference_source=reference, backend=backend)
    cat = CatalogProposer()
    return cat.implement(ctx, cat.ideas(ctx, History(), 1)[0], History(), 1)[0]


def _load(folder: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, folder / DROPIN_FILE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def dropin(folder: Path, name: str, reference: str, class_name: str, backend: str, device: str):
    """The drop-in module as a PR ships it, and (original, fused, inputs) on `device`."""
    folder.mkdir(parents=True)
    (folder / REFERENCE_FILE).write_text(reference)
    (folder / HEADER_FILE).write_text((ROOT / "runner/csrc/fusebot.h").read_text())
    cand = catalog_kernel(reference, backend)
    (folder / kernel_filename(backend)).write_text(next(iter(cand.sources.values())))
    spec = ProblemSpec(name=name, path=str(folder / REFERENCE_FILE), class_name=class_name)
    ref = _load_reference(folder / REFERENCE_FILE)
    torch.manual_seed(0)
    original = ref.Model(*ref.get_init_inputs()).eval()
    inputs = list(ref.get_inputs())
    calls = None
    if backend == "cuda":
        with torch.no_grad():
            out = original(*inputs)
        dt = lambda t: str(t.dtype).removeprefix("torch.")  # noqa: E731
        calls = [{"inputs": [[dt(t), list(t.shape)] for t in [*inputs, *original.state_dict().values()]],
                  "outputs": [[dt(out), list(out.shape)]]}]
    made = shipped(spec, cand, "0" * 64, calls=calls)
    if made.no_device_code:
        raise SystemExit(f"{name}: no device code ({made.no_device_code})")
    for fname, text in made.files.items():
        (folder / fname).write_text(text)
    mod = _load(folder, "dropin_host_" + folder.name)
    fused = getattr(mod, class_name)(*ref.get_init_inputs()).eval()
    fused.load_state_dict(original.state_dict())
    return mod, original.to(device), fused.to(device), [t.to(device) for t in inputs]


def _load_reference(path: Path):
    spec = importlib.util.spec_from_file_location("dropin_host_ref_" + path.parent.name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def raw_call(mod, fused, inputs):
    """The kernel alone, its arguments made once: a function of no arguments."""
    items = [*inputs, *mod._state(fused)]
    with torch.no_grad():
        out = fused(*inputs)
    outs = [torch.empty_like(out)]
    device = items[0].device
    if device.type != "cuda" or mod._LIB is not None:
        lib = mod._library(device)
        ins, outd = mod._describe_all(items), mod._describe_all(outs)
        if lib.fb_set_workspace is not None:
            lib.fb_set_workspace(None, 0)
        n_in, n_out = len(items), len(outs)
        stream = None if device.type != "cuda" else ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)
        return lambda: lib.fusebot_forward(ins, n_in, outd, n_out, stream) or (items, outs)  # the tensors kept alive
    plan = mod._find_plan(items, outs)
    drv, index = mod._driver_module(device)
    steps = [s for s in plan["steps"] if s["op"] == "launch"]
    if plan["workspace"] or len(steps) != len(plan["steps"]) or any(
            s["cooperative"] or s["cluster"] != [1, 1, 1] for s in steps):
        return lambda: mod._run_plan(items, outs, device)  # not a plain launch: the drop-in's own replay
    ptrs = [t.data_ptr() for t in (*items, *outs)]
    stream = ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)
    launches, keep = [], [items, outs]  # the tensors whose addresses the parameters hold, kept alive
    for s in steps:
        raw = bytearray.fromhex(s["params"])
        for off, k, delta in s["slots"]:
            struct.pack_into("<Q", raw, off, ptrs[k] + delta)
        buf = (ctypes.c_char * max(len(raw), 1)).from_buffer(raw)
        size = ctypes.c_size_t(len(raw))
        extra = (ctypes.c_void_p * 5)(1, ctypes.cast(buf, ctypes.c_void_p), 2,
                                      ctypes.cast(ctypes.pointer(size), ctypes.c_void_p), 0)
        keep += [raw, buf, size, extra]
        dims = [ctypes.c_uint(v) for v in (*s["grid"], *s["block"])]
        launches.append((drv.function(index, s["kernel"]), dims, ctypes.c_uint(s["shmem"]), extra))
    launch = drv.lib.cuLaunchKernel
    drv.context(index)

    def go():
        for fn, dims, shmem, extra in launches:
            launch(fn, *dims, shmem, stream, None, extra)
        return keep
    return go


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def best_us(fn, calls: int, rounds: int, cuda: bool, clock: str = "wall") -> float:
    """The best round's microseconds a call, over `rounds` rounds of `calls` back-to-back calls; by the wall clock,
    or by this thread's CPU time (`cpu`: what the call costs the calling thread, whatever else the host runs; not
    the time a GPU or another thread works)."""
    now = CLOCKS[clock]
    best = float("inf")
    for _ in range(rounds):
        if cuda:
            torch.cuda.synchronize()
        t0 = now()
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, (now() - t0) / calls)
    return best * 1e6


def time_problem(name: str, mod, original, fused, inputs: list, args, out: io.StringIO) -> dict[str, float]:
    """Microseconds a call of each way (and with --profile, the drop-in's cProfile table written to `out`)."""
    cuda = inputs[0].device.type == "cuda"
    with torch.no_grad():
        torch.testing.assert_close(fused(*inputs), original(*inputs))
        calls_before = type(fused).kernel_calls
        fused(*inputs)
        if type(fused).kernel_calls != calls_before + 1:
            raise SystemExit(f"{name}: the drop-in did not run its kernel")
        items = [*inputs, *mod._state(fused)]
        specs = [(tuple(o.shape), o.dtype, tuple(o.stride())) for o in [original(*inputs)]]
        prepared = mod._Call(items, specs) if hasattr(mod, "_Call") else None  # the signature's kernel path
        run = (lambda: mod._run(items, specs, prepared)) if prepared is not None else (lambda: mod._run(items, specs))
        fns = {"dropin_us": lambda: fused(*inputs), "run_us": run,
               "raw_us": raw_call(mod, fused, inputs), "eager_us": lambda: original(*inputs)}
        for fn in fns.values():  # warm: the library, the driver module, the plans
            for _ in range(20):
                fn()
        times = {key: best_us(fn, args.calls, args.rounds, cuda, args.clock) for key, fn in fns.items()}
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            n = max(args.calls * 5, 2000)
            for _ in range(n):
                fused(*inputs)
            prof.disable()
            out.write(f"\n## {name}: the drop-in's forward, {n} calls (cProfile, tottime)\n")
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    return times


def machine(device: str) -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor() or platform.machine())
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    gpu = f"; GPU {torch.cuda.get_device_name()}" if device == "cuda" else "; no GPU used"
    return (f"{cpu}, {os.cpu_count()} cores (torch threads {torch.get_num_threads()}), load average {load}{gpu}; "
            f"torch {torch.__version__}, Python {platform.python_version()}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--rows", type=int, help="row_gain's rows (default: 1024 on CUDA, 16 on the CPU)")
    ap.add_argument("--cols", type=int, help="row_gain's columns (default: 512 on CUDA, 64 on the CPU)")
    ap.add_argument("--calls", type=int, default=200, help="back-to-back calls a round")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall: elapsed time; cpu: the calling thread's CPU time (steadier on a loaded host)")
    ap.add_argument("--profile", action="store_true", help="also cProfile the drop-in's calls (top functions)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    device = "cuda" if args.backend == "cuda" else "cpu"
    cuda = device == "cuda"
    args.rows = args.rows or (1024 if cuda else 16)
    args.cols = args.cols or (512 if cuda else 64)
    out = io.StringIO()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fusebot-dropin-host-") as tmp:
        os.environ.setdefault("FUSEBOT_DROPIN_CACHE", str(Path(tmp) / "cache"))
        for k, (name, reference, cls) in enumerate(problems(args.rows, args.cols)):
            mod, original, fused, inputs = dropin(Path(tmp) / f"p{k}", name.split()[0], reference, cls,
                                                  args.backend, device)
            rows.append((name, time_problem(name, mod, original, fused, inputs, args, out)))
    keys = ["dropin_us", "run_us", "raw_us", "eager_us"]
    lines = [f"machine: {machine(device)}", f"backend {args.backend}; best of {args.rounds} rounds of {args.calls} "
             f"back-to-back calls, microseconds a call ({args.clock} clock)", "",
             "| problem | " + " | ".join(keys) + " | drop-in minus raw |", "| --- |" + " ---: |" * (len(keys) + 1)]
    for name, r in rows:
        lines.append(f"| {name} | " + " | ".join(f"{r[k]:.1f}" for k in keys) + f" | {r['dropin_us'] - r['raw_us']:.1f} |")
    sys.stdout.write("\n".join(lines) + "\n" + out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
