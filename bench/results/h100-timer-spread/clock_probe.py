"""Is the SM clock what moves short kernels' times? Per sample: flush, events around the call, sync, then a one-thread
kernel that spins 40k cycles and reads clock64 against %globaltimer (the SM's MHz right after the call)."""
import ctypes
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

here = Path(__file__).parent
so = here / "probe.so"
subprocess.run(["nvcc", "-O2", "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90", "-o", str(so), str(here / "probe.cu")], check=True)
lib = ctypes.CDLL(str(so))
lib.launch.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p]
slot = torch.zeros(2, dtype=torch.int64, device="cuda")
flush = torch.empty((100 << 20) // 4, dtype=torch.int32, device="cuda")

def mhz():
    lib.launch(slot.data_ptr(), 40000, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    c, ns = slot.tolist()
    return c / ns * 1000

def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))

cg = torch.compile(gelu)

def sample(fn):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    flush.zero_()
    s.record()
    fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e), mhz()

def run(label, fn, n=60):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts, fs = zip(*[sample(fn) for _ in range(n)])
    print(f"{label:28s} median {statistics.median(ts):.4f} ms (min {min(ts):.4f} max {max(ts):.4f})  "
          f"MHz after: median {statistics.median(fs):.0f} min {min(fs):.0f} max {max(fs):.0f}")
    return ts, fs

sys.stdout.write(torch.cuda.get_device_name(), "idle clock now:", f"{mhz():.0f} MHz" + '\n')
time.sleep(1.0)
sys.stdout.write("after 1 s idle:", f"{mhz():.0f} MHz" + '\n')
allt, allf = [], []
for rnd in range(6):
    x = torch.rand(8192, 8192, device="cuda")
    t, f = run(f"round {rnd} compiled GELU", lambda x=x: cg(x))
    allt += t
    allf += f
    y = torch.empty_like(x)
    run(f"round {rnd} copy", lambda x=x, y=y: y.copy_(x))
    if rnd == 2:
        time.sleep(2.0)
# correlation of per-sample time and clock
n = len(allt)
mt, mf = statistics.fmean(allt), statistics.fmean(allf)
cov = sum((a - mt) * (b - mf) for a, b in zip(allt, allf)) / n
r = cov / (statistics.pstdev(allt) * statistics.pstdev(allf) or 1)
sys.stdout.write(f"GELU samples: {n}, corr(time, MHz after) = {r:.2f}" + '\n')
# a busy GPU between samples: a back-to-back loop without host sync (events enqueued ahead)
x = torch.rand(8192, 8192, device="cuda")
for _ in range(3):
    cg(x)
ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(60)]
for s, e in ev:
    flush.zero_()
    s.record()
    cg(x)
    e.record()
torch.cuda.synchronize()
bt = [s.elapsed_time(e) for s, e in ev]
sys.stdout.write(f"enqueued ahead, one sync: median {statistics.median(bt):.4f} (min {min(bt):.4f} max {max(bt):.4f}); MHz {mhz():.0f}" + '\n')
for s, e in ev:
    flush.zero_()
    s.record()
    cg(x)
    e.record()
    e.synchronize()
st = [s.elapsed_time(e) for s, e in ev]
sys.stdout.write(f"synced each call, same x: median {statistics.median(st):.4f} (min {min(st):.4f} max {max(st):.4f})" + '\n')
