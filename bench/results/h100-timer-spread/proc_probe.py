"""Process-to-process spread: the same ops timed by runner.timing.Timer, inputs re-made each round.

FLUSH=zero (the timer's own) | read (sum a buffer of the flush's size instead) | zero+read (both)."""
import math
import os
import sys

import torch
from runner.timing import Timer

dev = "cuda"
ln = torch.nn.LayerNorm((64, 256, 256)).to(dev)
cl = torch.compile(ln)


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


cg = torch.compile(gelu)
t = Timer(dev)
mode = os.environ.get("FLUSH", "zero")
if mode != "zero":
    buf = torch.ones(t.flush_bytes // 4, dtype=torch.float32, device=dev)
    zero = t.flush

    def fl():
        if mode == "zero+read":
            zero()
        buf.sum()
    t.flush = fl
rows = []
for _ in range(4):
    x = torch.randn(8192, 8192, device=dev)
    y = torch.empty_like(x)
    xl = torch.randn(16, 64, 256, 256, device=dev)
    r = {"copy": t.measure(lambda x=x, y=y: y.copy_(x)).median_ms,
         "gelu-c": t.measure(lambda x=x: cg(x)).median_ms,
         "ln-c": t.measure(lambda xl=xl: cl(xl)).median_ms,
         "gelu-c2": t.measure(lambda x=x: cg(x)).median_ms}
    rows.append(r)
    del x, y, xl
alloc = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default")[:10]
sys.stdout.write(f"{alloc} {mode:9s} pid {os.getpid()}: "
                 + " | ".join(" ".join(f"{k} {v:.4f}" for k, v in r.items()) for r in rows) + "\n")
