"""What a parent-clocked batch's fingerprint costs per call, by path, on this machine's device: the steps the judge
subtracts from every back-to-back call (runner/harness/fingerprint.py), beside one read of the output.

    python bench/fingerprint_cost.py                    # CUDA where there is one, else the CPU
    python bench/fingerprint_cost.py --device cpu --dtype float32

Prints, per output size, the median ms of each path over `--reps` calls (after one warm-up call), and a read of the
output (`sum`) for scale.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import torch

from runner.harness import fingerprint

log = logging.getLogger("fingerprint_cost")


def median_ms(fn, device: str, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16", "float64"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sizes", default="65536,1048576,4194304,33554432,100663296", help="elements, comma-separated")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    dtype = getattr(torch, args.dtype)
    paths = {"of": fingerprint.of, "few_ops": fingerprint._few_ops, "few_reads": fingerprint._few_reads}
    if args.device == "cpu":
        paths["in_cache"] = fingerprint._in_cache
    elif fingerprint.triton is not None:
        paths["one_pass"] = fingerprint._one_pass
    log.info("device %s (%s), dtype %s, torch %s, median of %d calls, ms", args.device,
             torch.cuda.get_device_name() if args.device == "cuda" else "cpu", args.dtype, torch.__version__, args.reps)
    log.info("| elements | %s | sum |", " | ".join(paths))
    for n in (int(s) for s in args.sizes.split(",")):
        x = torch.randn(n, device=args.device).to(dtype)
        cells = []
        for name, fn in paths.items():
            big = name == "few_ops" and n > fingerprint.FEW_OPS * 8  # its temporaries: three copies, padded
            cells.append("-" if big else f"{median_ms(lambda f=fn, x=x: f(x, 7), args.device, args.reps):.3f}")
        cells.append(f"{median_ms(lambda x=x: x.sum(), args.device, args.reps):.3f}")
        log.info("| %d | %s |", n, " | ".join(cells))


if __name__ == "__main__":
    main()
