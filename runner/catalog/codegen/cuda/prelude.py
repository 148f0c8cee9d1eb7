"""The CUDA sources' fixed prelude: headers, conversions to and from fp32, vector loads and stores, warp
and block reductions, and the fast-math switches."""

from __future__ import annotations

PRELUDE = r"""#include "fusebot.h"
#pragma nv_diag_suppress 177
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <cooperative_groups.h>
#include <cuda_pipeline.h>
namespace cg = cooperative_groups;
#define FB_HD static __device__ __forceinline__
#define FB_M __device__ __forceinline__
typedef float fb_acc;

__device__ __forceinline__ float fb_f(float x) { return x; }
__device__ __forceinline__ float fb_f(double x) { return (float)x; }
__device__ __forceinline__ float fb_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float fb_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float fb_f(long long x) { return (float)x; }
__device__ __forceinline__ float fb_f(int x) { return (float)x; }
__device__ __forceinline__ float fb_f(bool x) { return x ? 1.0f : 0.0f; }
__device__ __forceinline__ float fb_f(unsigned char x) { return (float)x; }
__device__ __forceinline__ float fb_f(signed char x) { return (float)x; }
template <typename T> __device__ __forceinline__ T fb_to(float v) { return (T)v; }
template <> __device__ __forceinline__ __half fb_to<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 fb_to<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
// an index (argmax/argmin) is stored as it is: through a float it would round above 2^24
template <typename T> __device__ __forceinline__ T fb_to(long long v) { return (T)v; }
template <typename T, int V> struct alignas(sizeof(T) * V) FbVec { T v[V]; };

template <typename A> __device__ __forceinline__ A fb_shfl_xor(const A& a, int off) {
  static_assert(sizeof(A) % 4 == 0, "accumulators are made of 4-byte words");
  A r; const int* s = (const int*)&a; int* d = (int*)&r;
#pragma unroll
  for (int k = 0; k < (int)(sizeof(A) / 4); ++k) d[k] = __shfl_xor_sync(0xffffffffu, s[k], off);
  return r;
}
template <typename A> __device__ __forceinline__ void fb_warp_reduce(A& acc) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) { A o = fb_shfl_xor(acc, off); acc.merge(o); }
}
template <typename A, int NT> __device__ __forceinline__ void fb_block_reduce(A& acc) {
  __shared__ A sh[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  fb_warp_reduce(acc);
  if (lane == 0) sh[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    A t; t.init();
    if (lane < NT / 32) t = sh[lane];
    fb_warp_reduce(t);
    if (lane == 0) sh[0] = t;
  }
  __syncthreads();
  acc = sh[0];
  __syncthreads();
}
static int fb_sms() {
  static int n = 0;
  if (!n) { int dev = 0; cudaGetDevice(&dev); cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev); }
  return n > 0 ? n : 1;
}
static bool fb_aligned(const void* p, int bytes) { return ((unsigned long long)p % (unsigned long long)bytes) == 0; }
// a read-only load of V elements through the non-coherent path (ld.global.nc), as one access when it is 2-16 bytes
template <typename T, int V> __device__ __forceinline__ FbVec<T, V> fb_ldv(const T* p) {
  FbVec<T, V> r;
  constexpr int B = (int)sizeof(T) * V;
  if constexpr (B == 16) { const uint4 x = __ldg((const uint4*)p); memcpy(&r, &x, 16); }
  else if constexpr (B == 8) { const uint2 x = __ldg((const uint2*)p); memcpy(&r, &x, 8); }
  else if constexpr (B == 4) { const unsigned x = __ldg((const unsigned*)p); memcpy(&r, &x, 4); }
  else if constexpr (B == 2) { const unsigned short x = __ldg((const unsigned short*)p); memcpy(&r, &x, 2); }
  else if constexpr (B == 1) { const unsigned char x = __ldg((const unsigned char*)p); memcpy(&r, &x, 1); }
  else {
    static_assert(B % 16 == 0, "vector loads of 1, 2, 4, 8 or a multiple of 16 bytes");
#pragma unroll
    for (int c = 0; c < B / 16; ++c) { const uint4 x = __ldg((const uint4*)p + c); memcpy((char*)&r + 16 * c, &x, 16); }
  }
  return r;
}
template <typename T> __device__ __forceinline__ T fb_ld1(const T* p) { return fb_ldv<T, 1>(p).v[0]; }
// a store of V elements as one access of 2-16 bytes (several of 16 above that), in PTX: a vector written through the
// FbVec itself, or through memcpy into a uint4, was split by nvcc into one st.global.f32 per element (the H100's
// softmax on chip: 6.5 ms with float4 stores so split, against 4.7 for the same pipeline's st.global.v4)
template <typename T, int V> __device__ __forceinline__ void fb_stv(T* p, const FbVec<T, V>& r) {
  constexpr int B = (int)sizeof(T) * V;
#ifndef __CUDA_ARCH__
  memcpy(p, &r, B);  // the tests' emulation on the CPU (g++)
#else
  if constexpr (B % 16 == 0) {
    unsigned w[B / 4];
    memcpy(w, &r, B);
#pragma unroll
    for (int c = 0; c < B / 16; ++c)
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"((char*)p + 16 * c), "r"(w[4 * c]),
                   "r"(w[4 * c + 1]), "r"(w[4 * c + 2]), "r"(w[4 * c + 3]));
  } else if constexpr (B == 8) {
    unsigned w[2];
    memcpy(w, &r, 8);
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(w[0]), "r"(w[1]));
  } else if constexpr (B == 4) {
    unsigned w;
    memcpy(&w, &r, 4);
    asm volatile("st.global.b32 [%0], %1;" ::"l"(p), "r"(w));
  } else if constexpr (B == 2) {
    unsigned short w;
    memcpy(&w, &r, 2);
    asm volatile("st.global.b16 [%0], %1;" ::"l"(p), "h"(w));
  } else {
    static_assert(B == 1, "vector stores of 1, 2, 4, 8 or a multiple of 16 bytes");
    memcpy(p, &r, 1);
  }
#endif
}
__device__ __forceinline__ float fb_tanh_approx(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return tanhf(x);  // the tests' emulation on the CPU (g++)
#endif
}
// blocks of `threads` that fill every SM once (what a grid-stride loop wants)
template <typename K> static long long fb_wave(K kernel, int threads) {
  int nb = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kernel, threads, 0) != cudaSuccess || nb < 1) {
    (void)cudaGetLastError();
    nb = 1;
  }
  return (long long)nb * fb_sms();
}
"""


# the hardware's approximations: exp through ex2.approx.ftz, a division through rcp.approx, tanh in one tanh.approx.f32
# (sm_75 on; about 2^-11 relative error: the float64 oracle accepts it, or not, per dtype)
FAST = "#define FB_FAST\n#define FB_FAST_EXP(x) __expf(x)\n#define FB_FAST_DIV(x, y) __fdividef(x, y)\n" \
       "#define FB_FAST_LOG(x) __logf(x)\n#define FB_FAST_TANH(x) fb_tanh_approx(x)\n"
