"""Fast-format CUDA-C answers for tests/fixtures/problems/affine_relu_chain_gpu.py (y = (relu(x * 2 + 1) - 0.25) * 3),
as a model would write them: a scalar grid-stride kernel, a float4 one, one that does not build, one that forgets
the ReLU."""

from pathlib import Path

PROBLEM = Path(__file__).resolve().parents[1] / "fixtures/problems/affine_relu_chain_gpu.py"

SCALAR = r'''#include "fusebot.h"
#include <cuda_runtime.h>

// Grid-stride loop, one element per thread per step.  variant: VARIANT
__global__ void affine_relu_chain_scalar(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = x[i] * 2.0f + 1.0f;
    y[i] = ((v < 0.0f ? 0.0f : v) - 0.25f) * 3.0f;
  }
}

FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) return 1;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  int64_t blocks = (n + 255) / 256;
  if (blocks > 132 * 32) blocks = 132 * 32;
  affine_relu_chain_scalar<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(
      (const float*)in[0].data, (float*)out[0].data, n);
  return cudaGetLastError() == cudaSuccess ? 0 : 2;
}
'''

VEC4 = r'''#include "fusebot.h"
#include <cuda_runtime.h>
#include <stdint.h>

// float4 loads and stores (16 bytes per thread per step), a scalar kernel for the tail.  variant: VARIANT
__device__ __forceinline__ float chain(float x) {
  float v = x * 2.0f + 1.0f;
  return ((v < 0.0f ? 0.0f : v) - 0.25f) * 3.0f;
}

__global__ void affine_relu_chain_vec4(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
    float4 a = x[i];
    a.x = chain(a.x); a.y = chain(a.y); a.z = chain(a.z); a.w = chain(a.w);
    y[i] = a;
  }
}

__global__ void affine_relu_chain_tail(const float* __restrict__ x, float* __restrict__ y, int64_t start, int64_t n) {
  int64_t i = start + blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = chain(x[i]);
}

FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) return 1;
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
  cudaStream_t s = (cudaStream_t)stream;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  int64_t n4 = (((uintptr_t)x | (uintptr_t)y) % 16 == 0) ? n / 4 : 0;
  if (n4 > 0) {
    int64_t blocks = (n4 + 255) / 256;
    if (blocks > 132 * 16) blocks = 132 * 16;
    affine_relu_chain_vec4<<<(unsigned)blocks, 256, 0, s>>>((const float4*)x, (float4*)y, n4);
  }
  int64_t rest = n - 4 * n4;
  if (rest > 0) affine_relu_chain_tail<<<(unsigned)((rest + 255) / 256), 256, 0, s>>>(x, y, 4 * n4, n);
  return cudaGetLastError() == cudaSuccess ? 0 : 2;
}
'''

BROKEN = SCALAR.replace("float v =", "flaot v =")
WRONG = SCALAR.replace("(v < 0.0f ? 0.0f : v)", "v")


def answer(code: str, variant: str = "a") -> str:
    return f"A fused kernel:\n\n```cuda\n{code.replace('VARIANT', variant)}```\n"
