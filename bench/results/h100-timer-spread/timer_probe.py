"""Where does a short call's spread come from? own span vs the tail (device sync + host wake-up), two flushes."""
import math
import statistics
import sys

import torch
from runner.timing import Timer

dev = "cuda"


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


x = torch.randn(8192, 8192, device=dev)
ln = torch.nn.LayerNorm((64, 256, 256)).to(dev)
xl = torch.randn(16, 64, 256, 256, device=dev)
cg, cl = torch.compile(gelu), torch.compile(ln)
y = torch.empty_like(x)
fns = {"gelu-compile": lambda: cg(x), "ln-compile": lambda: cl(xl), "copy-268MB": lambda: y.copy_(x),
       "relu-eager": lambda: torch.relu(x)}
t = Timer(dev)
clean = torch.empty(t.flush_bytes // 4, dtype=torch.float32, device=dev)


def q(s):
    s, n = sorted(s), len(s)
    return f"med {statistics.median(s):.4f} q1 {s[n // 4]:.4f} q3 {s[3 * n // 4]:.4f} min {s[0]:.4f}"


floor = t.sync_floor_ms()
tails0 = [t._spans(lambda: None)[1] for _ in range(200)]
sys.stdout.write(f"sync floor {floor:.4f} ms; nothing-tail {q(tails0)}\n")
for name, fn in fns.items():
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    for flush in ("zero", "zero+read"):
        own, tail = [], []
        for _ in range(200):
            s, e, a = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            t.flush()
            if flush == "zero+read":
                clean.sum()
            s.record()
            fn()
            e.record()
            e.synchronize()
            torch.cuda.synchronize()
            a.record()
            a.synchronize()
            own.append(s.elapsed_time(e))
            tail.append(e.elapsed_time(a))
        comb = [o + max(0.0, tl - floor) for o, tl in zip(own, tail, strict=True)]
        sys.stdout.write(f"{name:14s} {flush:9s} own {q(own)} | tail {q(tail)} | own+tail-floor {q(comb)}\n")
    sys.stdout.write(f"{name:14s} Timer.measure x3: " + ", ".join(f"{t.measure(fn).median_ms:.4f}" for _ in range(3))
                     + "\n")
