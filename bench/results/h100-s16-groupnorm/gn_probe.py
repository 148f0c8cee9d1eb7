"""GroupNorm over KernelBench level1 35's shape (112 x 64 x 512 x 512, 8 groups: 896 rows of 8.4 MB): rows streamed
through a ring of shared-memory buffers by one group of blocks per row (gn_pipe.cu), publishing the next row's
partials before waiting for this row's or not, by the harness's timer (zeroing flush, paired sync)."""
import ctypes
import subprocess
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from runner.problem import strict_fp32
from runner.timing import Timer, TimerConfig

strict_fp32()
here = Path(__file__).parent
so = Path(tempfile.gettempdir()) / "gn_pipe.so"
subprocess.run(["nvcc", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
                "-gencode=arch=compute_90a,code=sm_90a", str(here / "gn_pipe.cu"), "-o", str(so)], check=True)
lib = ctypes.CDLL(str(so))
lib.gn_run.restype = ctypes.c_int
lib.gn_run.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                       ctypes.c_longlong, ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_float,
                       ctypes.c_void_p, ctypes.c_int]

B, C, H, W, groups = 112, 64, 512, 512, 8
rows, cpg = B * groups, C // groups
N = cpg * H * W
x = torch.rand(B, C, H, W, device="cuda")
gamma = torch.randn(C, device="cuda")
beta = torch.randn(C, device="cuda")
y = torch.empty_like(x)
ws = torch.zeros(rows * 264 * 4 + rows + 64, dtype=torch.int32, device="cuda")
eps = 1e-5
ref = F.group_norm(x, groups, gamma, beta, eps)
stream = torch.cuda.current_stream().cuda_stream
floor_ms = (2 * x.numel() + 2 * C) * 4 / 3.01e12 * 1e3
print(f"floor {floor_ms:.4f} ms (3.01 TB/s); 90% -> {floor_ms / 0.9:.4f} ms")
variants = {0: ("T1024 J4, 2 buffers", 132), 1: ("T1024 J4, 3 buffers", 132), 2: ("T1024 J4, 3 buffers, ahead", 132),
            3: ("T512 J8, 3 buffers, ahead", 132), 4: ("T1024 J4, 3 buffers, ahead, y stcs", 132),
            5: ("T512 J4, 3 buffers, ahead, 2/SM", 264), 6: ("T256 J8, 3 buffers, ahead, 2/SM", 264),
            7: ("T512 J4, 2 buffers, 2/SM", 264), 10: ("regs+smem T1024 J4, 1 group", 132),
            11: ("regs+smem T1024 J4, 1 group, ahead", 132), 12: ("regs+smem T1024 J8, 2 groups", 132),
            13: ("regs+smem T1024 J8, 2 groups, ahead", 132), 14: ("regs+smem T512 J8, 2 groups, 2/SM", 264),
            15: ("regs+smem T512 J8, 2 groups, 2/SM, ahead", 264)}
for v in (14, 15):  # (do not fit: two blocks of 512 threads at 78 registers each)
    del variants[v]


def run(v):
    G = variants[v][1]
    rc = lib.gn_run(v, x.data_ptr(), gamma.data_ptr(), beta.data_ptr(), y.data_ptr(), rows, N, groups, cpg, H * W,
                    ws.data_ptr(), eps, stream, G)
    if rc:
        raise RuntimeError(f"variant {v}: rc {rc}")


ok = {}
for v, (name, _) in variants.items():
    y.fill_(float("nan"))
    try:
        run(v)
        torch.cuda.synchronize()
    except RuntimeError as e:
        print(name, e)
        continue
    err = (y - ref).abs().max().item()
    ok[v] = err < 1e-4
    print(f"{name:40s} max abs err against eager {err:.3e} {'ok' if ok[v] else 'WRONG'}")
del ref

timer = Timer("cuda", TimerConfig(warmup=2, min_reps=10, max_reps=20, max_seconds=3))
for rep in range(2):
    t = timer.measure(lambda: F.group_norm(x, groups, gamma, beta, eps))
    print(f"{rep} {'eager':40s} median {t.median_ms:.4f} ms {100 * floor_ms / t.median_ms:.1f}%")
    for v, (name, _) in variants.items():
        if not ok.get(v):
            continue
        t = timer.measure(lambda v=v: run(v))
        print(f"{rep} {name:40s} median {t.median_ms:.4f} ms {100 * floor_ms / t.median_ms:.1f}%")
