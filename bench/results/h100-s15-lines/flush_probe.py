"""Does the timer's flush (zeroing 2 x L2, which leaves the L2 full of dirty lines) charge a short call for
writing them back? The same calls timed after three flushes, interleaved: Z (the timer's: zero 100 MB), ZR (zero,
then read another 100 MB: the L2 ends clean), R (read only)."""
from pathlib import Path

import torch
from runner.abi import KernelLibrary, as_tensor_args
from runner.build import build_many
from runner.problem import build_model, load, make_inputs, strict_fp32
from runner.proposer import ProblemContext
from runner.timing import Timer, TimerConfig

from bench.template_sweep import parse_params
from runner import timing
from runner.cli import problem_from_file
from runner.proposers.catalog import CatalogProposer

strict_fp32()
MODE = {"m": "Z"}
orig = timing.Timer.flush
state = {}
def flush(self):
    m = MODE["m"]
    if m in ("Z", "ZR"):
        orig(self)
    if m in ("ZR", "R"):
        if "b" not in state:
            state["b"] = torch.ones(self.flush_bytes // 4, device="cuda")
            state["o"] = torch.empty((), device="cuda")
        torch.sum(state["b"], dim=0, out=state["o"])
timing.Timer.flush = flush

def problem_fns(path, params):
    prob = load(problem_from_file(path))
    model = build_model(prob, prob.model_cls, 0, "cuda")
    inputs = make_inputs(prob, 1234, shape_set=0, randn=None, device="cuda")
    with torch.no_grad():
        ref = model(*inputs)
    nbytes = sum(t.numel() * t.element_size() for t in [*inputs, ref] if isinstance(t, torch.Tensor))
    cm = torch.compile(model)
    with torch.no_grad():
        cm(*inputs)
    prop = CatalogProposer()
    ctx = ProblemContext(name=path.stem, reference_source=path.read_text(), backend="cuda")
    pat = prop.pattern(ctx)
    c = prop.candidate(ctx, pat, parse_params(params))
    lib = KernelLibrary(build_many([c], cuda_arch="sm_90", jobs=4)[c.id].library)
    out = torch.empty_like(ref)
    args = as_tensor_args(inputs, "cuda") + list(model.state_dict().values())
    s = torch.cuda.current_stream().cuda_stream
    lib(args, [out], s)
    torch.cuda.synchronize()
    assert torch.allclose(out, ref, atol=1e-4, rtol=1e-4)
    def comp():
        with torch.no_grad():
            cm(*inputs)
    return nbytes, {"torch.compile": comp, "fusebot " + params: lambda: lib(args, [out], s)}

timer = Timer("cuda", TimerConfig(warmup=3, min_reps=10, max_reps=30, max_seconds=3))
B = torch.rand(4096, 4096, device="cuda")
y = torch.empty_like(B)
rows = [("copy_ 64 MB", 2 * B.numel() * 4, lambda: y.copy_(B))]
kb = Path("out/kb-suite")
for f, prm in [("level1_12_Matmul_with_diagonal_matrices_.py", "layout=bcast,vec=4,threads=256,grid=once"),
               ("level1_88_MinGPTNewGelu.py", "layout=flat,vec=4,threads=256,grid=once,unroll=4"),
               ("level1_40_LayerNorm.py", "layout=split,vec=4,threads=256,slices=16")]:
    nb, fns = problem_fns(kb / f, prm)
    rows += [(f[:24] + " " + k, nb, fn) for k, fn in fns.items()]
res = {}
for _rep in range(3):
    for m in ("Z", "ZR", "R"):
        MODE["m"] = m
        for name, _nb, fn in rows:
            res.setdefault((name, m), []).append(timer.measure(fn).median_ms)
print(torch.cuda.get_device_name())
print("| call | floor ms | Z ms (% floor) | ZR ms | R ms |")
for name, nb, _fn in rows:
    fl = nb / 3.01e12 * 1e3
    cells = [f"{min(res[(name, m)]):.4f} ({100 * fl / min(res[(name, m)]):.1f}%) [{' '.join(f'{x:.4f}' for x in res[(name, m)])}]" for m in ("Z", "ZR", "R")]
    print(f"| {name} | {fl:.4f} | " + " | ".join(cells) + " |")
