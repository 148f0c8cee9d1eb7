"""Same-size references for diag(a)@B's 134 MB call, by the sweep's timer config: a device copy of B, torch's
broadcast multiply into a preallocated output, and a plain read of B (sum)."""
import torch
from runner.problem import strict_fp32
from runner.timing import Timer, TimerConfig

strict_fp32()
N = M = 4096
a = torch.rand(N, device="cuda")
B = torch.rand(N, M, device="cuda")
y = torch.empty_like(B)
timer = Timer("cuda", TimerConfig(warmup=3, min_reps=10, max_reps=30, max_seconds=3))
floor_ms = (2 * B.numel() * 4 + N * 4) / 3.01e12 * 1e3
rows = {"copy_ (64 MB in, 64 MB out)": lambda: y.copy_(B),
        "torch.mul(a[:,None], B, out=y)": lambda: torch.mul(a[:, None], B, out=y),
        "clone": lambda: B.clone()}
for rep in range(3):
    for name, fn in rows.items():
        t = timer.measure(fn)
        print(f"{rep} {name:34s} median {t.median_ms:.4f} ms  {100*floor_ms/t.median_ms:.1f}% of floor")
