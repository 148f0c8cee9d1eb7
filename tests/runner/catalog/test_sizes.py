"""Sizes at run time (runner/catalog/sizes.py): a C++ kernel generated at the captured sizes serves other batch,
sequence and row counts where its `// fusebot-sizes:` line says so (checked against the reference module run at those
sizes), and refuses a size the line fixes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from runner.catalog.capture import capture_sources
from runner.catalog.codegen import cpu, cuda
from runner.catalog.codegen.common import NotExpressible
from runner.catalog.codegen.used import ACC_STRUCTS
from runner.catalog.ir import Input, Load, Op, Program
from runner.catalog.recognition import recognise
from runner.catalog.sizes import abi_sizes, free_dims, merged_dims, sizes_line
from runner.catalog.space import strategies
from runner.harness.build import CPU_FLAGS
from runner.harness.procs.abi import AbiError, KernelLibrary
from tests.runner.catalog.codegen.nvcc import compile_together

ROOT = Path(__file__).resolve().parents[3]
HEAD = "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
INIT = "\n\ndef get_init_inputs():\n    return []\n"

# name -> (source, the captured line, the inputs at other sizes)
PROBLEMS = {
    "masked_mean_pooling": (HEAD + """    def forward(self, x, mask):  # x: [B, T, C], mask: [B, T]
        m = mask.unsqueeze(-1).expand(x.size()).float()
        return torch.sum(x * m, 1) / torch.clamp(m.sum(1), min=1e-9)


def get_inputs():
    return [torch.randn(4, 16, 24), (torch.arange(16)[None, :] < torch.tensor([[16], [3], [9], [1]])).long()]
""" + INIT, "in0=d0,d1,d2 in1=d0,d1",
        lambda: [torch.randn(7, 5, 24), (torch.arange(5)[None, :] < torch.randint(1, 6, (7, 1))).long()]),
    "padding_mask_softmax": (HEAD + """    def forward(self, scores, mask):  # scores: [B, H, T, T], mask: [B, T]
        ext = (1.0 - mask[:, None, None, :].to(scores.dtype)) * torch.finfo(scores.dtype).min
        return torch.softmax(scores / 8.0 + ext, dim=-1)


def get_inputs():
    return [torch.randn(2, 3, 12, 12), (torch.arange(12)[None, :] < torch.tensor([[12], [5]])).long()]
""" + INIT, "in0=d0,d1,d2,d3 in1=d0,d3",
        lambda: [torch.randn(5, 3, 9, 9), (torch.arange(9)[None, :] < torch.randint(1, 10, (5, 1))).long()]),
    "rope_rotate_half": (HEAD + """    def forward(self, q, cos, sin):  # q: [B, H, T, D], cos, sin: [B, T, D]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        x1, x2 = q[..., : q.shape[-1] // 2], q[..., q.shape[-1] // 2:]
        return q * cos + torch.cat((-x2, x1), dim=-1) * sin


def get_inputs():
    return [torch.randn(2, 4, 12, 32), torch.randn(2, 12, 32), torch.randn(2, 12, 32)]
""" + INIT, "in0=d0,d1,d2,32 in1=d0,d2,32 in2=d0,d2,32",
        lambda: [torch.randn(3, 2, 7, 32), torch.randn(3, 7, 32), torch.randn(3, 7, 32)]),
    "rope_interleaved_stack": (HEAD + """    def forward(self, x, cos, sin):  # GPT-J: rotate_every_two
        x1, x2 = x[..., ::2], x[..., 1::2]
        rot = torch.stack((-x2, x1), dim=-1).flatten(-2)
        c = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
        s = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
        return x * c + rot * s


def get_inputs():
    return [torch.randn(2, 6, 3, 16), torch.randn(2, 6, 8), torch.randn(2, 6, 8)]
""" + INIT, "in0=d0,d1,d2,16 in1=d0,d1,8 in2=d0,d1,8",
        lambda: [torch.randn(3, 5, 2, 16), torch.randn(3, 5, 8), torch.randn(3, 5, 8)]),
    "rope_interleaved_view2": (HEAD + """    def forward(self, x, cos, sin):  # pairs through a view
        xr = x.view(*x.shape[:-1], -1, 2)
        x1, x2 = xr[..., 0], xr[..., 1]
        c, s = cos[:, :, None, :], sin[:, :, None, :]
        return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).view_as(x)


def get_inputs():
    return [torch.randn(2, 6, 3, 16), torch.randn(2, 6, 8), torch.randn(2, 6, 8)]
""" + INIT, "in0=d0,d1,d2,16 in1=d0,d1,8 in2=d0,d1,8",
        lambda: [torch.randn(4, 3, 5, 16), torch.randn(4, 3, 8), torch.randn(4, 3, 8)]),
    "group_norm_silu": (HEAD + """    def __init__(self):  # diffusers' ResnetBlock2D: norm1, then SiLU
        super().__init__()
        self.norm = nn.GroupNorm(4, 16, eps=1e-6)
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.1)
            self.norm.bias.normal_(0.0, 0.1)

    def forward(self, x):  # x: [N, C, H, W], read as [N, G, C/G, H*W]
        return torch.nn.functional.silu(self.norm(x))


def get_inputs():
    return [torch.randn(2, 16, 6, 5)]
""" + INIT, "in0=d0,16,m3,m3 in1=16 in2=16", lambda: [torch.randn(3, 16, 9, 7)]),
    "row_gain": (HEAD + """    def __init__(self, rows=64):
        super().__init__()
        self.gain = nn.Parameter(torch.rand(rows) + 0.5)

    def forward(self, x):  # x: [N, M]
        return torch.diag(self.gain) @ x


def get_inputs():
    return [torch.randn(64, 40)]
""" + INIT, "in0=d0,d1 in1=d0", lambda: [torch.randn(9, 13)]),
}


def _model(name: str, inputs: list[torch.Tensor]) -> torch.nn.Module:
    scope: dict = {}
    exec(PROBLEMS[name][0], scope)  # noqa: S102 - the test's own problem text
    return scope["Model"](inputs[0].shape[0]) if name == "row_gain" else scope["Model"]()


def _build(src: str, where: Path) -> KernelLibrary:
    (where / "k.cpp").write_text(src)
    subprocess.run(["g++", *CPU_FLAGS, "-I", str(ROOT / "runner/csrc"), "k.cpp", "-o", "k.so"], cwd=where, check=True,
                   capture_output=True, timeout=300)
    return KernelLibrary(where / "k.so")


@pytest.fixture(scope="module")
def programs() -> dict[str, Program]:
    sources = [PROBLEMS[n][0] for n in PROBLEMS]
    out = {}
    for name, g in zip(PROBLEMS, capture_sources(sources), strict=True):
        pat = recognise(g)
        assert pat.program is not None, (name, pat.reason)
        out[name] = pat.program
    return out


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_the_line_names_the_run_time_sizes(programs, name):
    src = cpu.render(programs[name], cpu.CpuParams("rows" if programs[name].is_row else "flat", threads="one"))
    assert src.splitlines()[2] == f"// fusebot-sizes: {PROBLEMS[name][1]}"


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_a_kernel_generated_at_one_size_is_right_at_another(programs, name, tmp_path):
    p = programs[name]
    lib = _build(cpu.render(p, cpu.CpuParams("rows" if p.is_row else "flat", threads="one")), tmp_path)
    torch.manual_seed(0)
    inputs = PROBLEMS[name][2]()
    model = _model(name, inputs).eval()
    with torch.no_grad():
        want = model(*inputs)
    assert inputs[0].shape != tuple(p.inputs[0].tensor or p.inputs[0].shape)  # another size than the captured one
    args = [*inputs, *model.state_dict().values()]
    assert fits(abi_sizes(p), args)  # the line admits these sizes
    out = torch.empty_like(want)
    lib(args, [out], None)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_a_merged_view_keeps_its_size_and_the_kernel_refuses_another(tmp_path):
    """x.view(B * T, C) read as [B*T, C]: the merged outer dim cannot follow the call (B and T are not known apart), so
    the line fixes it and the set-up refuses a call with another batch; the innermost dim, C, follows the tensor's
    last dim (merged_dims)."""
    x = Input(0, (16, 8), "float32", viewed=True, tensor=(2, 8, 8))
    p = Program(inputs=[x], out=Op("relu", (Load(0),)), shape=(16, 8), out_shape=(16, 8))
    assert free_dims(p, 0) == {} and merged_dims(p, 0) == {1: (2,)} and abi_sizes(p) == {0: ["2", "8", "d1"]}
    lib = _build(cpu.render(p, cpu.CpuParams("flat", threads="one")), tmp_path)
    for good in (torch.randn(2, 8, 8), torch.randn(2, 8, 5)):
        out = torch.empty(16, good.shape[-1])
        lib([good], [out], None)
        torch.testing.assert_close(out, good.view(16, -1).relu())
        assert fits(abi_sizes(p), [good])
    assert not fits(abi_sizes(p), [torch.randn(3, 8, 8)])
    with pytest.raises(AbiError, match="size 0 differs from the captured view"):
        lib([torch.randn(3, 8, 8)], [torch.empty(24, 8)], None)


def test_a_strided_slice_follows_its_tensor_outside_the_sliced_dim():
    """q[..., 8:] of q [B, H, T, 16]: B, H and T follow the call, the sliced dim keeps 16 (its offset stays inside)."""
    piece = Input(0, (2, 4, 8, 8), "float32", viewed=True, tensor=(2, 4, 8, 16), strides=(512, 128, 16, 1), offset=8,
                  shift=(0, 0, 0, 0), base=1024)
    p = Program(inputs=[piece], out=Load(0), shape=(2, 4, 8, 8), out_shape=(2, 4, 8, 8))
    assert free_dims(p, 0) == {0: 0, 1: 1, 2: 2}
    assert sizes_line(p) == "// fusebot-sizes: in0=d0,d1,d2,16"


def test_a_source_carries_only_the_accumulators_it_uses(programs):
    """A kernel without a reduction carries no accumulator struct; a softmax only its log-sum-exp."""
    flat = cpu.render(programs["row_gain"], cpu.CpuParams("flat", threads="one"))
    assert not [n for n in ACC_STRUCTS if f"struct {n} " in flat]
    soft = cpu.render(programs["padding_mask_softmax"], cpu.CpuParams("rows", "online", "one"))
    assert [n for n in ACC_STRUCTS if f"struct {n} " in soft] == ["AccLse"]


def _cuda_sources(p: Program) -> dict[cuda.CudaParams, str]:
    """The first parameter set of every CUDA strategy the catalog proposes for p, rendered."""
    out = {}
    for st in strategies(p, "cuda"):
        for params in st.params[:1]:
            try:
                out[params] = cuda.render(p, params)
            except NotExpressible:
                continue
    return out


def fits(line: dict[int, list[str]], tensors: list[torch.Tensor]) -> bool:
    """Do these tensors fit a source's sizes (abi_sizes): fixed sizes equal, each dK one size, the product of an
    input's mK dims that size?"""
    seen: dict[str, int] = {}
    for pos, dims in line.items():
        shape = tensors[pos].shape
        if len(shape) != len(dims):
            return False
        merged: dict[str, int] = {}
        for want, n in zip(dims, shape, strict=True):
            if want.startswith("m"):
                merged["d" + want[1:]] = merged.get("d" + want[1:], 1) * n
            elif (want.startswith("d") and seen.setdefault(want, n) != n) or (want[0].isdigit() and int(want) != n):
                return False
        if any(seen.setdefault(d, n) != n for d, n in merged.items()):
            return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_cuda_sources_of_these_problems_compile(programs, tmp_path):
    """Every strategy's first CUDA source for each problem compiles with nvcc (sm_90) and names its sizes."""
    sources = []
    for name, p in programs.items():
        for params, src in _cuda_sources(p).items():
            assert src.splitlines()[2] == sizes_line(p, 0, params.layout), (name, params.label())
            sources.append(src)
    assert len(sources) >= 2 * len(programs)
    rc, log = compile_together(sources, tmp_path)
    assert rc == 0, log[:3000]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_on_the_gpu_a_kernel_generated_at_one_size_is_right_at_another(programs, name, tmp_path):
    """On the GPU (run by hand: `pytest -m gpu tests/runner/catalog/test_sizes.py`): every strategy's first CUDA
    kernel, built for this GPU, against the reference module at sizes other than the captured ones; a kernel whose
    line fixes a size the call changes (a row held in registers or on chip) must refuse the call instead."""
    if not torch.cuda.is_available() or shutil.which("nvcc") is None:
        pytest.skip("needs a CUDA GPU and nvcc")
    major, minor = torch.cuda.get_device_capability()
    arch = f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"
    torch.manual_seed(0)
    inputs = PROBLEMS[name][2]()
    model = _model(name, inputs).eval()
    with torch.no_grad():
        want = model(*inputs)
    args = [t.cuda() for t in [*inputs, *model.state_dict().values()]]
    for k, (params, src) in enumerate(_cuda_sources(programs[name]).items()):
        (tmp_path / f"k{k}.cu").write_text(src)
        subprocess.run(["nvcc", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", arch, "-I",
                        str(ROOT / "runner/csrc"), f"k{k}.cu", "-o", f"k{k}.so"], cwd=tmp_path, check=True,
                       capture_output=True, timeout=300)
        out = torch.empty_like(want, device="cuda")
        lib = KernelLibrary(tmp_path / f"k{k}.so")
        if not fits(abi_sizes(programs[name], 0, params.layout), args):
            with pytest.raises(AbiError, match="differs from the captured"):
                lib(args, [out], torch.cuda.current_stream().cuda_stream)
            continue
        lib(args, [out], torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-5,
                                   msg=lambda m, lab=params.label(): f"{lab}: {m}")


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("layout", ["columns", "rows"])
def test_a_padding_mask_skips_the_padded_tokens_unread(programs, layout, tmp_path):
    """Masked mean pooling reads the mask first (runner.catalog.skipping.find_guard): a padded token's features are
    never read (NaN there changes nothing), an additive mask (the padding-mask softmax) is not skipped."""
    p = programs["masked_mean_pooling"]
    assert p.skip_zero is not None and p.inputs[p.skip_zero].abi == 1
    assert programs["padding_mask_softmax"].skip_zero is None
    lib = _build(cpu.render(p, cpu.CpuParams(layout, threads="one")), tmp_path)
    torch.manual_seed(1)
    x, mask = PROBLEMS["masked_mean_pooling"][2]()
    with torch.no_grad():
        want = _model("masked_mean_pooling", [x, mask])(x, mask)
    assert (mask == 0).any()
    x[mask == 0] = float("nan")
    out = torch.empty_like(want)
    lib([x, mask], [out], None)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
