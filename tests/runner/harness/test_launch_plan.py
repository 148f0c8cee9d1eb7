"""Device code only (runner/harness/launch_plan.py): the cubin made again from kernel.cu by the command the drop-in
states is the same bytes, and a kernel's host code (the catalog's or its author's), run with the recorder at a verified
call, gives the plan the drop-in launches (which kernel, its grid, which parameter bytes hold which tensor's address);
host code a plan cannot hold ships no binary at all. Needs nvcc, no GPU; the plans launched on a GPU:
test_dropin_cuda.py."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runner.contract import Candidate, ProblemSpec
from runner.harness import dropin_ship, launch_plan
from runner.harness.dropin import dropin_source, shipped
from runner.proposers.catalog import CatalogProposer
from runner.results.licence import with_spdx
from runner.search.types import History, ProblemContext

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")]

ROWS, COLS = 1024, 512
REFERENCE = f'''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, rows):
        super().__init__()
        self.gain = nn.Parameter(torch.rand(rows) + 0.5)

    def forward(self, x):
        return torch.diag(self.gain) @ x


def get_inputs():
    return [torch.randn({ROWS}, {COLS})]


def get_init_inputs():
    return [{ROWS}]
'''


# Run beside a drop-in with device code, on a host without a GPU: the original runs; each shipped image loads past its
# sha256 check; and the plan of the verified call, launched through a stand-in for the driver, writes each tensor's
# address where the recording found it and the rest of the parameter bytes as recorded.
PROBE = r"""
import ctypes, struct, types
import torch
import dropin

m = dropin.Model(1024).eval()
x = torch.randn(1024, 512)
with torch.no_grad():
    torch.testing.assert_close(m(x), torch.diag(m.gain) @ x)
assert dropin.Model.kernel_calls == 0 and dropin._LIBS == {} and dropin._sizes() is None
dropin._host_arch = lambda d: "sm_90"
image, arch = dropin._device_image(None)
assert arch == "sm_90" and image[:4] == b"\x7fELF"
dropin._host_arch = lambda d: "sm_100"
image, arch = dropin._device_image(None)
assert arch == "compute_90" and image.endswith(b"\0") and b".entry" in image

launched = []


class Lib:
    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        size = ctypes.cast(extra[3], ctypes.POINTER(ctypes.c_size_t)).contents.value
        launched.append((fn, (gx.value, gy.value, gz.value), (bx.value, by.value, bz.value),
                         ctypes.string_at(extra[1], size)))
        return 0


drv = types.SimpleNamespace(lib=Lib(), context=lambda i: None, function=lambda i, name: name,
                            _check=lambda rc, what: None)
dropin._driver_module = lambda device: (drv, 0)
torch.cuda.current_stream = lambda device=None: types.SimpleNamespace(cuda_stream=0)


def aligned(*shape):  # as the recording's stand-in addresses were (the drop-in copies an input that is not)
    n = 1
    for d in shape:
        n *= d
    buf = torch.empty(n + 64)
    skip = (-buf.data_ptr() % 256) // 4
    return buf[skip:skip + n].view(*shape)


x, gain, out = aligned(1024, 512).copy_(x), aligned(1024).copy_(m.gain.detach()), aligned(1024, 512)
assert dropin._run_plan([x, gain], [out], torch.device("cpu")) == 0
(step,) = [s for s in dropin.PLANS[0]["steps"] if s["op"] == "launch"]
((fn, grid, block, raw),) = launched
assert fn == step["kernel"] and list(grid) == step["grid"] and list(block) == step["block"]
recorded = bytes.fromhex(step["params"])
assert len(raw) == len(recorded)
ptrs = [x.data_ptr(), gain.data_ptr(), out.data_ptr()]
for off, k, delta in step["slots"]:
    assert struct.unpack_from("<Q", raw, off)[0] == ptrs[k] + delta
    recorded = recorded[:off] + raw[off:off + 8] + recorded[off + 8:]
assert raw == recorded
assert dropin._find_plan([torch.empty(1024, 256), gain], [torch.empty(1024, 256)]) is None
print("ok", len(dropin.PLANS))
"""


def catalog_kernel(reference: str, layout: str = "bcast") -> str:
    """The first catalog CUDA kernel of `reference` in `layout`."""
    ctx = ProblemContext(name="rowgain", reference_source=reference, backend="cuda")
    prop, history = CatalogProposer(), History()
    for idea in prop.ideas(ctx, history, 8):
        for cand in prop.implement(ctx, idea, history, 4):
            src = cand.sources["kernel.cu"]
            if src.startswith(f"// fusebot catalog: cuda-{layout}-"):
                return src
    raise AssertionError(f"the catalog offers no {layout} kernel")


def call(rows: int) -> dict:
    return {"inputs": [["float32", [rows, COLS]], ["float32", [rows]]], "outputs": [["float32", [rows, COLS]]]}


@pytest.fixture(scope="module")
def recorded():
    """The device code the runner ships for the catalog's RowGain kernel (made for sm_90 without a GPU here)."""
    src = catalog_kernel(REFERENCE)
    dev = dropin_ship.shipped_device_code(src, [call(ROWS), call(2 * ROWS)], arch="sm_90")
    assert dev is not None and sorted(dev.code) == ["compute_90", "sm_90"]
    assert dropin_ship.shipped_device_code(src, [call(ROWS), call(2 * ROWS)], arch="sm_90") is dev  # built once
    cubin = dropin_ship.decode_cubin(dev.files[launch_plan.cubin_filename("sm_90")])
    ptx = dev.files[launch_plan.ptx_filename("sm_90")]
    assert dev.code["sm_90"][1] == hashlib.sha256(cubin).hexdigest()
    return src, cubin, ptx, dev.plans


def test_the_stated_command_makes_the_shipped_cubin_again(recorded, tmp_path):
    src, cubin, ptx, _ = recorded
    text = dropin_ship.encode_cubin("sm_90", cubin)
    (tmp_path / "kernel.cu").write_text(src)
    (tmp_path / "fusebot.h").write_text((launch_plan.CSRC / "fusebot.h").read_text())
    cmd = text.splitlines()[0].split("made by: ", 1)[1].split(". sha256")[0].split()
    assert cmd == launch_plan.cubin_command("sm_90")
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "kernel.sm_90.cubin").read_bytes() == dropin_ship.decode_cubin(text)
    assert ".entry" in ptx and ".target sm_90" in ptx


def test_the_cubins_kernels_and_their_parameters(recorded):
    _, cubin, _, _ = recorded
    params = launch_plan.kernel_params(cubin)
    assert params and all(n.startswith("_Z") for n in params)
    for name, ps in params.items():
        assert ps, name
        ends = [off + size for off, size in ps]
        assert all(ps[k + 1][0] >= ends[k] for k in range(len(ps) - 1)), (name, ps)  # in order, not overlapping


BARRIER_KERNELS = r"""
extern "C" __global__ void scale(float* o, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = 2.0f * x[i];
}
extern "C" __global__ void block_sum(float* o, const float* x, int n) {
    __shared__ float part[256];
    part[threadIdx.x] = threadIdx.x < n ? x[threadIdx.x] : 0.0f;
    __syncthreads();
    float total = 0.0f;
    for (int j = 0; j < 256; ++j) total += part[j];
    o[threadIdx.x] = total;
}
"""


def _record_formats(cubin: bytes, kernel: str) -> list[tuple[int, int]]:
    """(byte position in the cubin, format) of each record of the kernel's .nv.info section."""
    off, size = next((o, n) for name, _t, o, n, _l in launch_plan._sections(cubin) if name == f".nv.info.{kernel}")
    out, i = [], off
    while i < off + size:
        out.append((i, cubin[i]))
        i += 4 + (-(-int.from_bytes(cubin[i + 2:i + 4], "little") // 4) * 4 if cubin[i] == 4 else 0)
    return out


def test_a_kernel_with_a_block_barrier_has_its_parameters_read(tmp_path):
    """A kernel with shared memory and a barrier carries one-byte attribute records, each padded to 4 bytes like the
    others (nvcc 13, sm_90): read as 3 bytes, the next record's padding was taken for an attribute of format 0, and
    no kernel with a block reduction (softmax, norms, losses) could ship its device code. A format this does not know
    is a PlanError, which the drop-in's caller turns into "ships no binary"."""
    (tmp_path / "k.cu").write_text(BARRIER_KERNELS)
    done = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", *launch_plan.DEVICE_FLAGS, "k.cu", "-o", "k.cubin"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    cubin = (tmp_path / "k.cubin").read_bytes()
    records = _record_formats(cubin, "block_sum")
    one_byte = [at for at, fmt in records if fmt == 2]
    assert one_byte, records  # the record this is about (EIFMT_BVAL) is there
    want = [(0, 8), (8, 8), (16, 4)]
    assert launch_plan.kernel_params(cubin) == {"scale": want, "block_sum": want}
    broken = bytearray(cubin)
    broken[one_byte[0]] = 0
    with pytest.raises(launch_plan.PlanError, match="unknown format 0"):
        launch_plan.kernel_params(bytes(broken))


def test_a_plan_holds_the_launch_the_host_code_chose_and_where_each_address_goes(recorded):
    _, cubin, _, plans = recorded
    params = launch_plan.kernel_params(cubin)
    assert [p["inputs"] for p in plans] == [call(ROWS)["inputs"], call(2 * ROWS)["inputs"]]
    small, large = (p["steps"] for p in plans)
    assert [s["op"] for s in small] == ["launch"]
    step = small[0]
    assert step["kernel"] in params and step["block"][0] % 32 == 0
    offset, size = params[step["kernel"]][-1]
    assert len(step["params"]) == 2 * (offset + size)
    # FbArgs opens with in[0], in[1] and out: the input, the gain and the output, each at its own offset
    assert sorted((k, off) for off, k, _ in step["slots"]) == [(0, 0), (1, 8), (2, 16)]
    assert large[0]["kernel"] == step["kernel"] and large[0]["grid"][0] == 2 * step["grid"][0]  # twice the rows


def test_a_plan_is_the_same_bytes_whoever_records_it(recorded, tmp_path):
    """The argument block is a kernel parameter: a byte the host code leaves unset (FbArgs' unused second-output
    slot held a stack address) changed the shipped plan on every run, and a PR's drop-in with it."""
    src, cubin, _, plans = recorded
    again = launch_plan.record(src, "sm_90", [call(ROWS), call(2 * ROWS)], tmp_path, cubin=cubin)
    assert again == plans


def test_a_call_the_host_code_refuses_is_no_plan(recorded, tmp_path):
    src = recorded[0]
    bad = {"inputs": [["float16", [ROWS, COLS]], ["float32", [ROWS]]], "outputs": [["float32", [ROWS, COLS]]]}
    with pytest.raises(launch_plan.PlanError, match="refused a verified call.*expected float32"):
        launch_plan.record(src, "sm_90", [bad], tmp_path, cubin=recorded[1])


def test_a_dropin_with_device_code_ships_no_host_code_and_falls_back_without_a_gpu(recorded, tmp_path, monkeypatch):
    src, cubin, ptx, plans = recorded
    dev = dropin_ship.DeviceCode("sm_90", {launch_plan.cubin_filename("sm_90"): dropin_ship.encode_cubin("sm_90", cubin),
                                           launch_plan.ptx_filename("sm_90"): ptx},
                                 {"sm_90": (launch_plan.cubin_filename("sm_90"), dropin_ship.hashlib.sha256(cubin).hexdigest()),
                                  "compute_90": (launch_plan.ptx_filename("sm_90"),
                                                 dropin_ship.hashlib.sha256(ptx.encode()).hexdigest())}, plans)
    (tmp_path / "reference.py").write_text(REFERENCE)
    (tmp_path / "ref_src.py").write_text(REFERENCE)
    spec = ProblemSpec(name="rowgain", path=str(tmp_path / "ref_src.py"))
    text = dropin_source(spec, "cuda", [], built_arch="sm_90", device_code=dev.code, plans=dev.plans)
    (tmp_path / "dropin.py").write_text(text)
    (tmp_path / "kernel.cu").write_text(src)
    for name, body in with_spdx(dev.files, "MIT").items():  # as a PR ships them: a licence line first
        (tmp_path / name).write_text(body)
    (tmp_path / "probe.py").write_text(PROBE)
    done = subprocess.run([sys.executable, "probe.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ok", "2"]
    assert not any(Path(tmp_path).glob("*.so*"))


def seed_call(rows: int, features: int = 4096) -> dict:
    """examples/mlp_epilogue.py's ScaledBiasReLU(features) on x (rows, features): x, scale, bias; the output."""
    return {"inputs": [["float32", [rows, features]], ["float32", []], ["float32", [features]]],
            "outputs": [["float32", [rows, features]]]}


SEED_CALL = seed_call(256)  # the example's own inputs


def test_a_kernel_with_its_authors_host_code_ships_device_code_too(monkeypatch):
    """The seed proposer's kernel (its own `<<<...>>>` launch, not the catalog's host code) records as a catalog
    kernel does: one launch of its fused kernel, x, scale, bias and the output in its parameters' slots."""
    from tests.verdicts import SPEC, seed_candidate  # noqa: PLC0415

    monkeypatch.setattr(dropin_ship, "current_arch", lambda backend: "sm_90")  # the runner's GPU, absent here
    cand = seed_candidate("cuda")
    got = shipped(SPEC, cand, calls=[SEED_CALL])
    assert got.no_device_code == "" and sorted(got.files) == ["dropin.py", "kernel.compute_90.ptx",
                                                              "kernel.sm_90.cubin.b64"]
    dev = dropin_ship.shipped_device_code(cand.sources["kernel.cu"], [SEED_CALL], arch="sm_90")
    assert isinstance(dev, dropin_ship.DeviceCode), dev
    (plan,) = dev.plans
    (step,) = plan["steps"]
    assert step["op"] == "launch" and "fb_fused" in step["kernel"] and plan["workspace"] == 0
    assert sorted(k for _, k, _ in step["slots"]) == [0, 1, 2, 3]  # x, scale, bias and the output, each an address


REFUSES = """#include <cuda_runtime.h>
#include "fusebot.h"
__global__ void fb_copy(const float* x, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}
FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  float first;  // the launcher reads device memory on the host: no plan can hold that
  if (cudaMemcpy(&first, in[0].data, sizeof first, cudaMemcpyDeviceToHost) != cudaSuccess) return 7;
  fb_copy<<<1, 256, 0, (cudaStream_t)stream>>>((const float*)in[0].data, (float*)out[0].data, 256);
  return 0;
}
"""


OWN_MEMORY = REFUSES.replace("""  float first;  // the launcher reads device memory on the host: no plan can hold that
  if (cudaMemcpy(&first, in[0].data, sizeof first, cudaMemcpyDeviceToHost) != cudaSuccess) return 7;
  fb_copy<<<1, 256, 0, (cudaStream_t)stream>>>((const float*)in[0].data, (float*)out[0].data, 256);
  return 0;""", """  float* scratch = 0;  // memory of its own, its errors unchecked: its address would be this process's
  cudaMalloc((void**)&scratch, 1024);
  fb_copy<<<1, 256, 0, (cudaStream_t)stream>>>((const float*)in[0].data, scratch, 256);
  fb_copy<<<1, 256, 0, (cudaStream_t)stream>>>(scratch, (float*)out[0].data, 256);
  cudaFree(scratch);
  return 0;""")


def test_a_launcher_with_memory_of_its_own_has_no_plan():
    assert "cudaMalloc" in OWN_MEMORY
    call1 = {"inputs": [["float32", [256]]], "outputs": [["float32", [256]]]}
    why = dropin_ship.shipped_device_code(OWN_MEMORY, [call1], arch="sm_90")
    assert isinstance(why, str) and "cannot be written down as launch plans" in why and "unsupported allocation" in why


def test_host_code_a_plan_cannot_hold_ships_no_binary_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(dropin_ship, "current_arch", lambda backend: "sm_90")
    spec = ProblemSpec(name="copy", path=str(tmp_path / "ref.py"))
    cand = Candidate(id="memcpy", format="fast", backend="cuda", sources={"kernel.cu": REFUSES})
    copy_call = {"inputs": [["float32", [256]]], "outputs": [["float32", [256]]]}
    why = dropin_ship.shipped_device_code(REFUSES, [copy_call], arch="sm_90")
    assert isinstance(why, str) and "its host code cannot be written down as launch plans" in why
    assert "refused a verified call (7)" in why
    got = shipped(spec, cand, calls=[copy_call])
    assert list(got.files) == ["dropin.py"] and got.no_device_code == why  # no cubin, no PTX, no host library
    assert "DEVICE_CODE = {}" in got.files["dropin.py"] and "SHIPPED = {}" in got.files["dropin.py"]
    assert dropin_ship.shipped_device_code(REFUSES, [], arch="sm_90") == "no verified call to record a launch plan at"
