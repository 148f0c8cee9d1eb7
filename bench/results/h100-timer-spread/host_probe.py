"""Is the host's own time per call what spreads short kernels' event times? Per sample, alternating: (A) the
timer's way: flush, start event, call, end event, sync
(B) the same with a GPU spin of ~100 us queued after the
flush, so the GPU is still busy when the call's kernels arrive. Host time from the flush's launch to the call's
return is recorded for A."""
import statistics
import sys
import time

import torch

flush = torch.empty((100 << 20) // 4, dtype=torch.int32, device="cuda")

def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))

cg = torch.compile(gelu)
ln = torch.nn.LayerNorm((64, 256, 256), device="cuda")
cl = torch.compile(ln)

def sample(fn, spin):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter_ns()
    flush.zero_()
    if spin:
        torch.cuda._sleep(spin)
    s.record()
    fn()
    t1 = time.perf_counter_ns()
    e.record()
    e.synchronize()
    return s.elapsed_time(e), (t1 - t0) / 1e3

def corr(a, b):
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b)) / len(a)
    return cov / ((statistics.pstdev(a) * statistics.pstdev(b)) or 1)

sys.stdout.write(torch.cuda.get_device_name() + '\n')
with torch.no_grad():
    for rnd in range(5):
        x = torch.rand(8192, 8192, device="cuda")
        z = torch.rand(16, 64, 256, 256, device="cuda")
        for name, fn in (("compiled GELU", lambda x=x: cg(x)), ("compiled LayerNorm", lambda z=z: cl(z)), ("eager tanh", lambda x=x: torch.tanh(x))):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            A, H, B = [], [], []
            for _ in range(60):
                t, h = sample(fn, 0)
                A.append(t)
                H.append(h)
                B.append(sample(fn, 200_000)[0])
            print(f"round {rnd} {name:20s} A {statistics.median(A):.4f} ms [{min(A):.4f}-{max(A):.4f}]  "
                  f"B (GPU busy) {statistics.median(B):.4f} [{min(B):.4f}-{max(B):.4f}]  host us {statistics.median(H):.0f} "
                  f"[{min(H):.0f}-{max(H):.0f}]  corr(A, host) {corr(A, H):.2f}")
