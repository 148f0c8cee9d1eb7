"""Host time per call of the pieces of a generated drop-in's call, beside the harness's own call of the same kernel
library: where the drop-in's extra microseconds go (bench/dropin_overhead.py measures the total on the GPU's clock).

    python bench/dropin_host_pieces.py out/h100-catalog/problems/level1_88_MinGPTNewGelu

Each piece runs 20 times, then 200 times timed with perf_counter and no synchronisation inside the loop (the kernels
are queued, not waited for): microseconds of host work per call. The drop-in "then" is the folder's own dropin.py,
"now" the one this code generates for the same kernel. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from dropin_overhead import _load, regenerate  # noqa: E402

from runner.harness.procs.abi import KernelLibrary  # noqa: E402


def pieces(folder: Path, tmp: Path) -> dict:
    old = _load(folder / "dropin.py", "pieces_then")
    new = _load(regenerate(folder, tmp, old) / "dropin.py", "pieces_now")
    ref = new._ref
    init = ref.get_init_inputs()
    fn, fo = new.Model(*init).cuda().eval(), old.Model(*init).cuda().eval()
    x = [t.cuda() for t in ref.get_inputs()]
    lib = KernelLibrary(Path(new._library()._name))
    named = dict(fn.named_parameters()) | dict(fn.named_buffers())
    state = [named[n] for n in fn._fusebot_state_names]
    dev, key = x[0].device, fn._fusebot_key

    def harness():  # as runner/harness/procs/contestant.py's _call (what it timed until it timed drop-ins)
        outs = [torch.empty(x[0].shape, device="cuda")]
        lib([*x, *state], outs, torch.cuda.current_stream().cuda_stream)

    return {
        "harness call (contestant's)": harness,
        "drop-in then forward": lambda: fo(*x),
        "drop-in now forward": lambda: fn(*x),
        "now _run": lambda: new._run(x, state, key),
        "now fused op": lambda: new.fused(x, state, key),
        "lib call only": lambda: lib([*x, *state], [x[0]], 0),
        "current_stream(dev)": lambda: torch.cuda.current_stream(dev).cuda_stream,
        "current_stream()": lambda: torch.cuda.current_stream().cuda_stream,
        "torch.empty": lambda: torch.empty(x[0].shape, device="cuda"),
        "is_compiling": lambda: torch.compiler.is_compiling(),
        "state lookup": lambda: dict(fn.named_parameters()) | dict(fn.named_buffers()),
        "describe_all(4)": lambda: new._describe_all([*x, *state, x[0]]),
        "out_specs": lambda: new._out_specs(key, x, state),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    args = ap.parse_args(argv)
    lines = ["| piece | host us per call |", "| --- | ---: |"]
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        for name, fn in pieces(args.folder, Path(tmp)).items():
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            n = 200
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            lines.append(f"| {name} | {(t1 - t0) / n * 1e6:.1f} |")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
