// GroupNorm probe (KernelBench level1 35: x 112 x 64 x 512 x 512, 8 groups: 896 rows of 8 x 512 x 512 = 8.4 MB): one
// group of G blocks per row, rows streamed through a ring of NB shared-memory buffers (cp.async, one commit group a
// row). AHEAD = 1: a block publishes row r+1's partials before it waits for row r's, so the wait for a row overlaps
// the next row's pass instead of following it. Each thread reads and writes only its own positions (j * T + tid of
// its block's slice): no barrier guards a buffer's reuse.
#include <cuda_runtime.h>
#include <stdint.h>

struct Part { float n, mean, m2, pad; };

template <int T> __device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) red[w] = v;
  __syncthreads();
  if (w == 0) {
    v = l < T / 32 ? red[l] : 0.f;
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (l == 0) red[32] = v;
  }
  __syncthreads();
  return red[32];
}


// Chan's merge of a row's G partials (G <= 2 T): each thread loads its share once (q = tid, tid + T), then the sum of
// n * mean, and of m2 + n * (mean_q - mean)^2 about the row's mean. (Re-reading the partials from L2 for the second
// sum cost 5-7% on this shape: a row's merge is on its critical path.)
struct Share { float4 a, b; };
__device__ __forceinline__ Share load_share(const Part* ws, int G) {
  Share s;
  s.a = s.b = make_float4(0.f, 0.f, 0.f, 0.f);
  const int q = threadIdx.x;
  if (q < G) s.a = __ldcg((const float4*)&ws[q]);
  if (q + blockDim.x < G) s.b = __ldcg((const float4*)&ws[q + blockDim.x]);
  return s;
}
__device__ __forceinline__ float share_mean(const Share& s) { return s.a.x * s.a.y + s.b.x * s.b.y; }
__device__ __forceinline__ float share_m2(const Share& s, float mean) {
  const float d = s.a.y - mean, e = s.b.y - mean;
  return (s.a.z + s.a.x * d * d) + (s.b.z + s.b.x * e * e);
}

__device__ __forceinline__ void cpx(float4* s, const float4* g) {
  unsigned d = (unsigned)__cvta_generic_to_shared(s);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(g) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait_group() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

template <int T, int J>
__device__ __forceinline__ void fill(float4* buf, const float4* __restrict__ x, long long r, int O, int N4, int lo, int n4) {
  if (r < O) {
    const float4* xr = x + r * N4 + lo;
#pragma unroll
    for (int j = 0; j < J; ++j) { const int i = j * T + threadIdx.x; if (i < n4) cpx(buf + i, xr + i); }
  }
  commit();
}

// this block's partial of row r: its slice's count, mean and squared deviations, published; no wait
template <int T, int J>
__device__ __forceinline__ void stats(const float4* buf, int r, int n4, Part* ws, unsigned* cnt, float* red) {
  const int tid = threadIdx.x;
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < J; ++j) { const int i = j * T + tid; if (i < n4) { const float4 v = buf[i]; s += (v.x + v.y) + (v.z + v.w); } }
  const float cntf = 4.f * n4;
  const float lmean = block_sum<T>(s, red) / fmaxf(cntf, 1.f);
  float q = 0.f;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = j * T + tid;
    if (i < n4) {
      const float4 v = buf[i];
      const float a = v.x - lmean, c = v.y - lmean, d = v.z - lmean, e = v.w - lmean;
      q += (a * a + c * c) + (d * d + e * e);
    }
  }
  const float m2 = block_sum<T>(q, red);
  if (tid == 0) {
    Part p; p.n = cntf; p.mean = lmean; p.m2 = m2; p.pad = 0.f;
    ws[(long long)r * gridDim.x + blockIdx.x] = p;
    __threadfence();
    atomicAdd(&cnt[r], 1u);
  }
}

// wait for row r's G partials, merge them (Chan), write the row out from the buffer
template <int T, int J, int CS>
__device__ __forceinline__ void finish(const float4* buf, int r, const float* __restrict__ gamma, const float* __restrict__ beta,
                                       float4* __restrict__ y, int N4, int lo, int n4, int groups, int cpg, int ch4,
                                       Part* ws, unsigned* cnt, float eps, float* red) {
  const int tid = threadIdx.x, G = gridDim.x;
  if (tid == 0) {
    while (*(volatile unsigned*)&cnt[r] < (unsigned)G) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();
  const float total = 4.f * (float)N4;
  const Share part = load_share(ws + (long long)r * G, G);
  const float mean = block_sum<T>(share_mean(part), red) / total;
  const float var = block_sum<T>(share_m2(part, mean), red) / total;
  const float rstd = 1.f / sqrtf(var + eps);
  const int c0 = (r % groups) * cpg;
  float4* yr = y + (long long)r * N4 + lo;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = j * T + tid;
    if (i < n4) {
      const float4 v = buf[i];
      const int c = c0 + (lo + i) / ch4;
      const float sc = rstd * __ldg(gamma + c), sh = __ldg(beta + c) - mean * sc;
      float4 o;
      o.x = v.x * sc + sh; o.y = v.y * sc + sh; o.z = v.z * sc + sh; o.w = v.w * sc + sh;
      if (CS) __stcs(yr + i, o); else yr[i] = o;
    }
  }
}

template <int T, int J, int NB, int AHEAD, int CS>
__global__ void __launch_bounds__(T) gn_pipe(const float4* __restrict__ x, const float* __restrict__ gamma,
                                             const float* __restrict__ beta, float4* __restrict__ y, int O, int N4,
                                             int chunk4, int groups, int cpg, int ch4, Part* ws, unsigned* cnt, float eps) {
  extern __shared__ float4 sm[];
  __shared__ float red[33];
  const int lo = blockIdx.x * chunk4;
  const int n4 = max(0, min(lo + chunk4, N4) - lo);
#pragma unroll
  for (int k = 0; k < NB; ++k) fill<T, J>(sm + k * chunk4, x, k, O, N4, lo, n4);
  if (AHEAD) {
    wait_group<NB - 1>();
    stats<T, J>(sm, 0, n4, ws, cnt, red);
  }
  for (int r = 0; r < O; ++r) {
    float4* buf = sm + (r % NB) * chunk4;
    if (AHEAD) {
      if (r + 1 < O) {
        wait_group<NB - 2>();
        stats<T, J>(sm + ((r + 1) % NB) * chunk4, r + 1, n4, ws, cnt, red);
      }
    } else {
      wait_group<NB - 1>();
      stats<T, J>(buf, r, n4, ws, cnt, red);
    }
    finish<T, J, CS>(buf, r, gamma, beta, y, N4, lo, n4, groups, cpg, ch4, ws, cnt, eps, red);
    fill<T, J>(buf, x, r + NB, O, N4, lo, n4);
  }
}

template <int T, int J, int NB, int AHEAD, int CS>
static int launch(const float* x, const float* gamma, const float* beta, float* y, int O, long long N, int groups,
                  int cpg, long long chsize, void* wsbuf, float eps, cudaStream_t s, int G) {
  const int N4 = (int)(N / 4);
  const int chunk4 = (N4 + G - 1) / G;
  if (chunk4 > J * T || N % 4 || chsize % 4 || G > 2 * T) return 2;
  auto k = gn_pipe<T, J, NB, AHEAD, CS>;
  const int smem = NB * chunk4 * 16;
  if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) return 5;
  int per = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, T, smem);
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if ((long long)per * sms < G) return 4;
  Part* ws = (Part*)wsbuf;
  unsigned* cnt = (unsigned*)(ws + (size_t)O * G);
  cudaMemsetAsync(cnt, 0, O * sizeof(unsigned), s);
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.gridDim = dim3(G);
  cfg.blockDim = dim3(T);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaError_t e = cudaLaunchKernelEx(&cfg, k, (const float4*)x, gamma, beta, (float4*)y, O, N4, chunk4, groups, cpg,
                                     (int)(chsize / 4), ws, cnt, eps);
  return e == cudaSuccess ? 0 : 10 + (int)e;
}


// Registers and shared memory as a block's two buffers (rows alternating), NGRP groups of gridDim.x / NGRP blocks each
// taking every NGRP-th row. AHEAD = 1: both rows' partials are published before either row's wait.
template <int T, int J> __device__ __forceinline__ void ldregs(float4 (&rb)[J], const float4* __restrict__ xr, int n4) {
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = j * T + threadIdx.x;
    if (i < n4) asm volatile("ld.global.nc.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(rb[j].x), "=f"(rb[j].y), "=f"(rb[j].z), "=f"(rb[j].w) : "l"(xr + i));
  }
}
template <int T, int J, bool SM>
__device__ __forceinline__ void stats2(const float4 (&rb)[J], const float4* sm, int r, int S, int slice, int n4, Part* ws,
                                       unsigned* cnt, float* red) {
  const int tid = threadIdx.x;
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < J; ++j) { const int i = j * T + tid; if (i < n4) { const float4 v = SM ? sm[i] : rb[j]; s += (v.x + v.y) + (v.z + v.w); } }
  const float cntf = 4.f * n4;
  const float lmean = block_sum<T>(s, red) / fmaxf(cntf, 1.f);
  float q = 0.f;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = j * T + tid;
    if (i < n4) {
      const float4 v = SM ? sm[i] : rb[j];
      const float a = v.x - lmean, c = v.y - lmean, d = v.z - lmean, e = v.w - lmean;
      q += (a * a + c * c) + (d * d + e * e);
    }
  }
  const float m2 = block_sum<T>(q, red);
  if (tid == 0) {
    Part p; p.n = cntf; p.mean = lmean; p.m2 = m2; p.pad = 0.f;
    ws[(long long)r * S + slice] = p;
    __threadfence();
    atomicAdd(&cnt[r], 1u);
  }
}
template <int T, int J, bool SM>
__device__ __forceinline__ void finish2(const float4 (&rb)[J], const float4* sm, int r, int S, const float* __restrict__ gamma,
                                        const float* __restrict__ beta, float4* __restrict__ y, int N4, int lo, int n4,
                                        int groups, int cpg, int ch4, Part* ws, unsigned* cnt, float eps, float* red) {
  const int tid = threadIdx.x;
  if (tid == 0) {
    while (*(volatile unsigned*)&cnt[r] < (unsigned)S) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();
  const float total = 4.f * (float)N4;
  const Share part = load_share(ws + (long long)r * S, S);
  const float mean = block_sum<T>(share_mean(part), red) / total;
  const float var = block_sum<T>(share_m2(part, mean), red) / total;
  const float rstd = 1.f / sqrtf(var + eps);
  const int c0 = (r % groups) * cpg;
  float4* yr = y + (long long)r * N4 + lo;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = j * T + tid;
    if (i < n4) {
      const float4 v = SM ? sm[i] : rb[j];
      const int c = c0 + (lo + i) / ch4;
      const float sc = rstd * __ldg(gamma + c), sh = __ldg(beta + c) - mean * sc;
      float4 o;
      o.x = v.x * sc + sh; o.y = v.y * sc + sh; o.z = v.z * sc + sh; o.w = v.w * sc + sh;
      yr[i] = o;
    }
  }
}

template <int T, int J, int NGRP, int AHEAD>
__global__ void __launch_bounds__(T) gn_rs(const float4* __restrict__ x, const float* __restrict__ gamma,
                                           const float* __restrict__ beta, float4* __restrict__ y, int O, int N4,
                                           int chunk4, int groups, int cpg, int ch4, Part* ws, unsigned* cnt, float eps) {
  extern __shared__ float4 sm[];
  __shared__ float red[33];
  const int S = gridDim.x / NGRP, grp = blockIdx.x / S, slice = blockIdx.x % S;
  const int lo = slice * chunk4;
  const int n4 = max(0, min(lo + chunk4, N4) - lo);
  float4 rb[J];
#pragma unroll
  for (int j = 0; j < J; ++j) rb[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (grp < O) ldregs<T, J>(rb, x + (long long)grp * N4 + lo, n4);
  fill<T, J>(sm, x, grp + NGRP, O, N4, lo, n4);
  for (int r = grp; r < O; r += 2 * NGRP) {
    const int r1 = r + NGRP;
    if (AHEAD) {
      stats2<T, J, false>(rb, sm, r, S, slice, n4, ws, cnt, red);
      if (r1 < O) { wait_group<0>(); stats2<T, J, true>(rb, sm, r1, S, slice, n4, ws, cnt, red); }
      finish2<T, J, false>(rb, sm, r, S, gamma, beta, y, N4, lo, n4, groups, cpg, ch4, ws, cnt, eps, red);
      if (r + 2 * NGRP < O) ldregs<T, J>(rb, x + (long long)(r + 2 * NGRP) * N4 + lo, n4);
      if (r1 < O) finish2<T, J, true>(rb, sm, r1, S, gamma, beta, y, N4, lo, n4, groups, cpg, ch4, ws, cnt, eps, red);
    } else {
      stats2<T, J, false>(rb, sm, r, S, slice, n4, ws, cnt, red);
      finish2<T, J, false>(rb, sm, r, S, gamma, beta, y, N4, lo, n4, groups, cpg, ch4, ws, cnt, eps, red);
      if (r + 2 * NGRP < O) ldregs<T, J>(rb, x + (long long)(r + 2 * NGRP) * N4 + lo, n4);
      if (r1 < O) {
        wait_group<0>();
        stats2<T, J, true>(rb, sm, r1, S, slice, n4, ws, cnt, red);
        finish2<T, J, true>(rb, sm, r1, S, gamma, beta, y, N4, lo, n4, groups, cpg, ch4, ws, cnt, eps, red);
      }
    }
    fill<T, J>(sm, x, r1 + 2 * NGRP, O, N4, lo, n4);
  }
}

template <int T, int J, int NGRP, int AHEAD>
static int launch_rs(const float* x, const float* gamma, const float* beta, float* y, int O, long long N, int groups,
                     int cpg, long long chsize, void* wsbuf, float eps, cudaStream_t s, int G) {
  const int N4 = (int)(N / 4);
  const int S = G / NGRP;
  const int chunk4 = (N4 + S - 1) / S;
  if (chunk4 > J * T || N % 4 || chsize % 4 || G % NGRP || S > 2 * T) return 2;
  auto k = gn_rs<T, J, NGRP, AHEAD>;
  const int smem = chunk4 * 16;
  if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) return 5;
  int per = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, T, smem);
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if ((long long)per * sms < G) return 4;
  Part* ws = (Part*)wsbuf;
  unsigned* cnt = (unsigned*)(ws + (size_t)O * S);
  cudaMemsetAsync(cnt, 0, O * sizeof(unsigned), s);
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.gridDim = dim3(G);
  cfg.blockDim = dim3(T);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaError_t e = cudaLaunchKernelEx(&cfg, k, (const float4*)x, gamma, beta, (float4*)y, O, N4, chunk4, groups, cpg,
                                     (int)(chsize / 4), ws, cnt, eps);
  return e == cudaSuccess ? 0 : 10 + (int)e;
}
#define W(id, T, J, NG, A) case id: return launch_rs<T, J, NG, A>(x, gamma, beta, y, O, N, groups, cpg, chsize, ws, eps, s, G);
#define V(id, T, J, NB, A, CS) case id: return launch<T, J, NB, A, CS>(x, gamma, beta, y, O, N, groups, cpg, chsize, ws, eps, s, G);
extern "C" int gn_run(int variant, const float* x, const float* gamma, const float* beta, float* y, int O, long long N,
                      int groups, int cpg, long long chsize, void* ws, float eps, void* stream, int G) {
  cudaStream_t s = (cudaStream_t)stream;
  switch (variant) {
    V(0, 1024, 4, 2, 0, 0)
    V(1, 1024, 4, 3, 0, 0)
    V(2, 1024, 4, 3, 1, 0)
    V(3, 512, 8, 3, 1, 0)
    V(4, 1024, 4, 3, 1, 1)
    V(5, 512, 4, 3, 1, 0)   // two blocks per SM (G = 264)
    V(6, 256, 8, 3, 1, 0)   // two blocks per SM (G = 264)
    V(7, 512, 4, 2, 0, 0)   // two blocks per SM, no publishing ahead
    W(10, 1024, 4, 1, 0)
    W(11, 1024, 4, 1, 1)
    W(12, 1024, 8, 2, 0)
    W(13, 1024, 8, 2, 1)
    W(14, 512, 8, 2, 0)   // 264 blocks: two per SM
    W(15, 512, 8, 2, 1)
    default: return 1;
  }
}
