"""Is a short elementwise call's time set by where its output lies? tanh(x, out=view at an offset), two passes."""
import sys

import torch
from runner.timing import Timer, TimerConfig

t = Timer("cuda", TimerConfig(max_reps=40, max_seconds=2))
N = 8192 * 8192
x = torch.randn(N, device="cuda")
pool = torch.empty(N + (160 << 20) // 4, device="cuda")
offs = [0, 4 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 3 << 20, 8 << 20, 32 << 20, 64 << 20, 100 << 20, 128 << 20,
        150 << 20]
res = {o: [] for o in offs}
for _ in range(2):
    for o in offs:
        out = pool[o // 4: o // 4 + N]
        res[o].append(t.measure(lambda out=out: torch.tanh(x, out=out)).median_ms)
for o in offs:
    sys.stdout.write(f"out at +{o >> 10:7d} KiB: " + " ".join(f"{m:.4f}" for m in res[o]) + "\n")
