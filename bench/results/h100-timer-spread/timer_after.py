"""runner.timing's Timer on short calls, inputs re-made each round: with the lead (this commit) and without it
(`_sleep` off: the timer before), alternating in one process. Each figure one Timer median, ms."""
import sys

import torch
from runner.timing import Timer, TimerConfig

from runner import timing


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))

cg = torch.compile(gelu)
ln = torch.nn.LayerNorm((64, 256, 256), device="cuda")
cl = torch.compile(ln)
cfg = TimerConfig()
sleep = timing._sleep
sys.stdout.write(torch.cuda.get_device_name() + '\n')
sys.stdout.write("| round | call | with lead: median ms | host us | lead us | without lead: median ms |" + '\n')
sys.stdout.write("| --- | --- | ---: | ---: | ---: | ---: |" + '\n')
with torch.no_grad():
    for rnd in range(4):
        x = torch.rand(8192, 8192, device="cuda")
        z = torch.rand(16, 64, 256, 256, device="cuda")
        for name, fn in (("torch.compile MinGPT GELU", lambda x=x: cg(x)), ("torch.compile LayerNorm", lambda z=z: cl(z)),
                         ("eager tanh", lambda x=x: torch.tanh(x))):
            timing._sleep = sleep
            a = Timer("cuda", cfg).measure(fn)
            timing._sleep = None
            b = Timer("cuda", cfg).measure(fn)
            timing._sleep = sleep
            sys.stdout.write(f"| {rnd} | {name} | {a.median_ms:.4f} | {a.host_ms * 1000:.0f} | {a.lead_ms * 1000:.0f} | {b.median_ms:.4f} |" + '\n')
