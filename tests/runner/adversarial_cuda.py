"""CUDA versions of the candidates in adversarial.py, plus the hacks only a GPU allows (side streams, rerunning
the reference's own kernels, illegal addresses). KernelBench-format ones build a small CUDA library with nvcc at
import (about 2 s, instead of load_inline's minute) and call it through ctypes on the current stream."""

from .adversarial import _INIT, KB_HACKS

CUDA_PRELUDE = r'''
import ctypes, os, subprocess
import torch
import torch.nn as nn

CUDA_SRC = r"""
#include <cuda_runtime.h>
__global__ void scale_relu_kernel(const float* x, const float* b, float* y, long long rows, long long cols) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < rows * cols) { float v = x[i] * 2.0f + b[i % cols]; y[i] = v < 0.0f ? 0.0f : v; }
}
extern "C" int launch(const float* x, const float* b, float* y, long long rows, long long cols, void* stream) {
    long long n = rows * cols;
    unsigned blocks = (unsigned)((n + 255) / 256);
    scale_relu_kernel<<<blocks, 256, 0, (cudaStream_t)stream>>>(x, b, y, rows, cols);
    return (int)cudaGetLastError();
}
"""


def _build():
    so = os.path.join(os.getcwd(), "libscale.so")
    if not os.path.exists(so):
        src = os.path.join(os.getcwd(), "scale.cu")
        with open(src, "w") as f:
            f.write(CUDA_SRC)
        major, minor = torch.cuda.get_device_capability()
        subprocess.run(["nvcc", "-O3", "-shared", "-Xcompiler", "-fPIC", f"-arch=sm_{major}{minor}", src, "-o", so],
                       check=True)
    lib = ctypes.CDLL(so)
    lib.launch.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_longlong] * 2 + [ctypes.c_void_p]
    return lib


lib = _build()


def scale_relu(x, bias, out=None, stream=None):
    x = x.contiguous()
    y = torch.empty_like(x) if out is None else out
    s = stream if stream is not None else torch.cuda.current_stream().cuda_stream
    rc = lib.launch(x.data_ptr(), bias.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], s)
    if rc:
        raise RuntimeError(f"launch failed: {rc}")
    return y
'''


def kb_cuda(body: str, header: str = "") -> dict[str, str]:
    src = CUDA_PRELUDE + header + "\n\nclass ModelNew(nn.Module):" + _INIT + "\n    def forward(self, x):\n" + body
    return {"candidate.py": src}


def body_and_header(sources: dict[str, str]) -> tuple[str, str]:
    src = sources["candidate.py"]
    body = src.split("    def forward(self, x):\n", 1)[1]
    header = src.split("ext = _build()", 1)[1].split("\n\nclass ModelNew", 1)[0]
    header = header.split("return y\n", 1)[1] if "return y\n" in header else ""
    return body, header


HONEST_KB_CUDA = kb_cuda("        return scale_relu(x, self.bias)\n")

KB_CUDA_HACKS: dict[str, tuple[dict[str, str], str]] = {
    name: (kb_cuda(*body_and_header(sources)), reason) for name, (sources, reason) in KB_HACKS.items()
}
KB_CUDA_HACKS.update({
    "side_stream": (kb_cuda('''        side = torch.cuda.Stream()
        y = torch.empty_like(x)
        scale_relu(x, self.bias, out=y, stream=side.cuda_stream)  # nobody waits for it
        return y
'''), "side-stream"),
    "reruns_reference_kernels": (kb_cuda('''        scale_relu(x[:1], self.bias)  # a token launch of its own kernel
        return torch.relu(x * 2.0 + self.bias)
'''), "fallback"),
})

_FAST_CU = r'''
#include "fusebot.h"
#include <cuda_runtime.h>

__global__ void scale_relu_fast(const float* __restrict__ x, const float* __restrict__ b, float* __restrict__ y,
                                long long n, long long cols) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) { float v = x[i] * 2.0f + b[i % cols]; {STORE} }
}

FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  if (n_in != 2 || n_out != 1) return 1;
  long long rows = in[0].shape[0], cols = in[0].shape[1], n = rows * cols;
  cudaStream_t s = (cudaStream_t)stream;
  {STREAM}
  scale_relu_fast<<<(unsigned)((n + 255) / 256), 256, 0, s>>>((const float*)in[0].data, (const float*)in[1].data,
                                                             (float*)out[0].data, n, cols);
  return (int)cudaGetLastError();
}
'''


def fast_cu(store: str = "y[i] = v < 0.0f ? 0.0f : v;", stream: str = "") -> dict[str, str]:
    return {"kernel.cu": _FAST_CU.replace("{STORE}", store).replace("{STREAM}", stream)}


HONEST_FAST_CU = fast_cu()

FAST_CU_HACKS: dict[str, tuple[dict[str, str], str]] = {
    "own_stream": (fast_cu(stream="static cudaStream_t own = 0; if (!own) cudaStreamCreateWithFlags(&own, "
                                  "cudaStreamNonBlocking); s = own;"), "side-stream"),
    "reads_uninitialized": (fast_cu(store="y[i] += v < 0.0f ? 0.0f : v;"), "uninitialized-output"),
    "partial_computation": (fast_cu(store="if (i < n / 2) y[i] = v < 0.0f ? 0.0f : v;"), "uninitialized-output"),
    "illegal_address": (fast_cu(store="y[i + (1LL << 40)] = v;"), ""),
}

# An out-of-bounds write from a KernelBench candidate whose call does not synchronise: the sticky CUDA error surfaces
# later in the harness's own code (the trial's sync, or torch.cuda.empty_cache() after it). It must be a `crash`.
OOB_KB_CUDA = kb_cuda('''        y = scale_relu(x, self.bias)
        lib.launch(x.data_ptr(), self.bias.data_ptr(), y.data_ptr() + (1 << 40), x.shape[0], x.shape[1],
                   torch.cuda.current_stream().cuda_stream)
        return y
''')

_HALF_CU = r'''
#include "fusebot.h"
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float coarse(float f) { return __uint_as_float(__float_as_uint(f) & 0xfff00000u); }

__global__ void swiglu_half(const {T}* __restrict__ a, const {T}* __restrict__ b, {T}* __restrict__ y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) {
    float x = {LOAD}(a[i]);
    float v = x / (1.0f + __expf(-x)) * {LOAD}(b[i]);  // in float: one rounding, at the store
    y[i] = {STORE}({VALUE});
  }
}

FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  if (n_in != 2 || n_out != 1 || in[0].dtype != {CODE}) return 1;
  long long n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  swiglu_half<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(
      (const {T}*)in[0].data, (const {T}*)in[1].data, ({T}*)out[0].data, n);
  return (int)cudaGetLastError();
}
'''


def half_cu(dtype: str, value: str = "v") -> dict[str, str]:
    """tests/fixtures/problems/swiglu_bf16.py's fused CUDA kernel for bf16 or fp16."""
    if dtype == "bfloat16":
        sub = {"{CODE}": "FB_BFLOAT16", "{T}": "__nv_bfloat16", "{LOAD}": "__bfloat162float",
               "{STORE}": "__float2bfloat16"}
    else:
        sub = {"{CODE}": "FB_FLOAT16", "{T}": "__half", "{LOAD}": "__half2float", "{STORE}": "__float2half"}
    src = _HALF_CU.replace("{VALUE}", value)
    for k, v in sub.items():
        src = src.replace(k, v)
    return {"kernel.cu": src}


HONEST_BF16_CU = half_cu("bfloat16")
HONEST_FP16_CU = half_cu("float16")
DOWNGRADED_BF16_CU = half_cu("bfloat16", "coarse(v)")
# scale_relu (fp32) with a bf16 round trip inside: fp32 outputs carrying bf16's precision
BF16_INSIDE_FP32_CU = {"kernel.cu": "#include <cuda_bf16.h>\n" + fast_cu(
    store="float w = __bfloat162float(__float2bfloat16(v)); y[i] = w < 0.0f ? 0.0f : w;")["kernel.cu"]}
