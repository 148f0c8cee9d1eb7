# ruff: noqa: E402
"""What a user's call of a generated drop-in costs, beside what the harness times: for each bench problem folder
(bench's `problems/<name>/`, with reference.py, dropin.py and kernel.cu), the same timer over

- eager: the reference module;
- torch.compile: the reference module compiled;
- harness call: the bare kernel library, called as the harness's contestant called it until it timed drop-ins
  (outputs allocated, arguments described through the C ABI, one call);
- drop-in: the generated module's forward (its custom op, state lookup, output shapes, the same library);
- with --regenerate, also the drop-in this repository's code generates now for the same kernel (in a copy of the
  folder), to see what a change of the generated runtime does.

    python bench/dropin_overhead.py [--regenerate] out/h100-catalog/problems/level1_40_LayerNorm [more folders]

The drop-in builds its kernel with nvcc on first use. Prints a Markdown table; "drop-in - harness" is the per-call
host work a bare-call figure does not contain (on a kernel of milliseconds it is noise; on a short one it is not).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import logging
import shutil
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.contract import ProblemSpec  # noqa: E402
from runner.harness.problem import strict_fp32  # noqa: E402
from runner.harness.procs.abi import KernelLibrary  # noqa: E402
from runner.harness.timing import (
    Timer,
    TimerConfig,  # noqa: E402
)
from runner.results.dropin import (
    CUDA_FLAGS,
    REFERENCE_FILE,
    dropin_source,  # noqa: E402
)

log = logging.getLogger("dropin_overhead")


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def regenerate(folder: Path, into: Path, old) -> Path:
    """A copy of `folder` whose dropin.py is what this code generates for the same kernel, flags and reference as
    `old`, the folder's own drop-in module (loaded)."""
    copy = into / folder.name
    shutil.copytree(folder, copy)
    kernel = (folder / old.KERNEL).read_bytes()
    spec = ProblemSpec(name=folder.name, path=str(copy / REFERENCE_FILE))
    (copy / "dropin.py").write_text(dropin_source(spec, old.BACKEND, list(old.FLAGS[len(CUDA_FLAGS):]),
                                                  hashlib.sha256(kernel).hexdigest(), built_for=old.BUILT_FOR))
    return copy


def measure(folder: Path, timer: Timer, into: Path | None = None) -> dict:
    """The timings of one folder; with `into`, also of the drop-in this code generates (regenerated there)."""
    tag = folder.name.lower()
    drop = _load(folder / "dropin.py", f"fusebot_dropin_{tag}")
    regenerated = regenerate(folder, into, drop) if into is not None else None
    ref = drop._ref  # the reference module the drop-in itself imported
    torch.manual_seed(0)
    init = ref.get_init_inputs()
    model = ref.Model(*init).cuda().eval()
    fused = drop.Model(*init).cuda().eval()
    fused.load_state_dict(model.state_dict())
    inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in ref.get_inputs()]
    with torch.no_grad():
        want, got = model(*inputs), fused(*inputs)
        ok = torch.allclose(got, want, rtol=1e-4, atol=1e-4)
        lib = KernelLibrary(Path(drop._library()._name))
        named = dict(fused.named_parameters()) | dict(fused.named_buffers())
        state = [named[n] for n in fused._fusebot_state_names]
        stream = torch.cuda.current_stream().cuda_stream

        def harness_call():
            outs = [torch.empty(want.shape, dtype=want.dtype, device="cuda")]
            lib([*inputs, *state], outs, stream)
            return outs[0]

        compiled = torch.compile(model)
        compiled(*inputs)
        row = {"problem": folder.name, "matches": ok}
        runs = [("eager_ms", lambda: model(*inputs)), ("compile_ms", lambda: compiled(*inputs)),
                ("harness_ms", harness_call), ("dropin_ms", lambda: fused(*inputs))]
        if regenerated is not None:
            now = _load(regenerated / "dropin.py", f"fusebot_dropin_now_{tag}").Model(*init).cuda().eval()
            now.load_state_dict(model.state_dict())
            row["matches"] = ok and torch.allclose(now(*inputs), want, rtol=1e-4, atol=1e-4)
            runs.append(("dropin_now_ms", lambda: now(*inputs)))
        for key, fn in runs:
            row[key] = timer.measure(fn).median_ms
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--regenerate", action="store_true", help="also time the drop-in this code generates")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not torch.cuda.is_available():
        log.error("no CUDA device")
        return 2
    timer = Timer("cuda", TimerConfig(warmup=5, min_reps=30, max_reps=200, max_seconds=5))
    lines = [f"{torch.cuda.get_device_name()}; medians of CUDA-event timings, L2 flushed", "",
             "| problem | matches | eager ms | torch.compile ms | harness call ms | drop-in ms | drop-in - harness us |"
             + (" drop-in now ms | now - harness us |" if args.regenerate else ""),
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if args.regenerate else "")]
    strict_fp32()
    with tempfile.TemporaryDirectory() as tmp:
        for folder in args.folders:
            r = measure(folder, timer, Path(tmp) if args.regenerate else None)
            line = (f"| {r['problem']} | {'yes' if r['matches'] else 'NO'} | {r['eager_ms']:.4g} | "
                    f"{r['compile_ms']:.4g} | {r['harness_ms']:.4g} | {r['dropin_ms']:.4g} | "
                    f"{(r['dropin_ms'] - r['harness_ms']) * 1000:.1f} |")
            if args.regenerate:
                line += f" {r['dropin_now_ms']:.4g} | {(r['dropin_now_ms'] - r['harness_ms']) * 1000:.1f} |"
            lines.append(line)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
