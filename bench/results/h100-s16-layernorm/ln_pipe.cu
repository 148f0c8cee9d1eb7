// LayerNorm probe: one row at a time across the whole grid (one block per SM), rows alternating between a register
// buffer and a shared-memory buffer so that the next row's read is in flight while this row's blocks wait on its
// counter and write it out. Each thread reads and writes only its own positions (j * T + tid of its block's slice).
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

struct Part { float n, mean, m2, pad; };

__device__ __forceinline__ uint64_t pol_first() { uint64_t p; asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p)); return p; }
__device__ __forceinline__ uint64_t pol_last() { uint64_t p; asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p)); return p; }

template <int H> __device__ __forceinline__ float4 ldx(const float4* a, uint64_t pol) {  // x into registers, issued now
  float4 v;
  if (H) asm volatile("ld.global.nc.L2::cache_hint.v4.f32 {%0,%1,%2,%3}, [%4], %5;" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(a), "l"(pol));
  else asm volatile("ld.global.nc.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(a));
  return v;
}
template <int H> __device__ __forceinline__ float4 ldw(const float4* a, uint64_t pol) {  // weight, bias
  float4 v;
  if (H) asm("ld.global.nc.L2::cache_hint.v4.f32 {%0,%1,%2,%3}, [%4], %5;" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(a), "l"(pol));
  else v = __ldg(a);
  return v;
}
template <int H> __device__ __forceinline__ void sty(float4* a, float4 v, uint64_t pol) {
  if (H == 1) asm volatile("st.global.L2::cache_hint.v4.f32 [%0], {%1,%2,%3,%4}, %5;" :: "l"(a), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "l"(pol) : "memory");
  else if (H == 2) __stcs(a, v);
  else *a = v;
}
template <int H> __device__ __forceinline__ void cpx(float4* s, const float4* g, uint64_t pol) {
  unsigned d = (unsigned)__cvta_generic_to_shared(s);
  if (H) asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" :: "r"(d), "l"(g), "l"(pol) : "memory");
  else asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(g) : "memory");
}

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

template <int T, int J, int XH, int WH, int YH, int MODE, bool SM>
__device__ __forceinline__ void row_step(const float4 (&rb)[J], const float4* sm, int r, const float4* __restrict__ w,
                                         const float4* __restrict__ b, float4* __restrict__ y, int N4, int lo, int n4,
                                         Part* ws, unsigned* cnt, float eps, float* red, uint64_t pl, uint64_t pf,
                                         const float4* swb, int K) {
  const int tid = threadIdx.x, G = gridDim.x, g = blockIdx.x;
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = j * T + tid;
    if (i < n4) { const float4 v = SM ? sm[i] : rb[j]; s += (v.x + v.y) + (v.z + v.w); }
  }
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
    ws[r * G + g] = p;
    __threadfence();
    atomicAdd(&cnt[r], 1u);
    if (!(MODE & 2)) while (*(volatile unsigned*)&cnt[r] < (unsigned)G) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();
  // Chan's merge of the G partials: the mean first, then the squares about it
  Part p; p.n = 0.f; p.mean = 0.f; p.m2 = 0.f;
  if (tid < G) { const float4 t = __ldcg((const float4*)&ws[r * G + tid]); p.n = t.x; p.mean = t.y; p.m2 = t.z; }
  const float total = 4.f * (float)N4;
  const float mean = block_sum<T>(p.n * p.mean, red) / total;
  const float dm = p.mean - mean;
  const float var = block_sum<T>(p.m2 + p.n * dm * dm, red) / total;
  const float rstd = 1.f / sqrtf(var + eps);
  float4* yr = y + (long long)r * N4 + lo;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = j * T + tid;
    if (i < n4) {
      const float4 v = SM ? sm[i] : rb[j];
      float4 ww, bb;
      if (MODE & 1) { ww = make_float4(1.f, 1.f, 1.f, 1.f); bb = make_float4(0.f, 0.f, 0.f, 0.f); }
      else if ((MODE & 4) && i < K) { ww = swb[i]; bb = swb[K + i]; }
      else { ww = ldw<WH>(w + lo + i, pl); bb = ldw<WH>(b + lo + i, pl); }
      float4 o;
      o.x = (v.x - mean) * rstd * ww.x + bb.x;
      o.y = (v.y - mean) * rstd * ww.y + bb.y;
      o.z = (v.z - mean) * rstd * ww.z + bb.z;
      o.w = (v.w - mean) * rstd * ww.w + bb.w;
      sty<YH>(yr + i, o, pf);
    }
  }
}

template <int T, int J, int XH, int WH, int YH, int MODE>
__global__ void __launch_bounds__(T, 1) ln_pipe(const float4* __restrict__ x, const float4* __restrict__ w,
                                                const float4* __restrict__ b, float4* __restrict__ y, int O, int N4,
                                                int chunk4, Part* ws, unsigned* cnt, float eps, int K) {
  extern __shared__ float4 sm[];
  float4* swb = sm + chunk4;
  __shared__ float red[33];
  const int tid = threadIdx.x;
  const int lo = blockIdx.x * chunk4;
  const int n4 = max(0, min(lo + chunk4, N4) - lo);
  const uint64_t pf = pol_first(), pl = pol_last();
  if (MODE & 4) {  // this block's first K positions of the weight and bias, kept for every row
    for (int i = tid; i < K && i < n4; i += T) { swb[i] = __ldg(w + lo + i); swb[K + i] = __ldg(b + lo + i); }
    __syncthreads();
  }
  float4 rb[J];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = j * T + tid;
    rb[j] = i < n4 ? ldx<XH>(x + lo + i, pf) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (O > 1) {
#pragma unroll
    for (int j = 0; j < J; ++j) { const int i = j * T + tid; if (i < n4) cpx<XH>(sm + i, x + N4 + lo + i, pf); }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  for (int r = 0; r < O; r += 2) {
    row_step<T, J, XH, WH, YH, MODE, false>(rb, sm, r, w, b, y, N4, lo, n4, ws, cnt, eps, red, pl, pf, swb, K);
    if (r + 2 < O) {
      const float4* xr = x + (long long)(r + 2) * N4 + lo;
#pragma unroll
      for (int j = 0; j < J; ++j) { const int i = j * T + tid; if (i < n4) rb[j] = ldx<XH>(xr + i, pf); }
    }
    if (r + 1 < O) {
      asm volatile("cp.async.wait_all;" ::: "memory");  // this thread's own positions: no barrier needed
      row_step<T, J, XH, WH, YH, MODE, true>(rb, sm, r + 1, w, b, y, N4, lo, n4, ws, cnt, eps, red, pl, pf, swb, K);
      if (r + 3 < O) {
        const float4* xr = x + (long long)(r + 3) * N4 + lo;
#pragma unroll
        for (int j = 0; j < J; ++j) { const int i = j * T + tid; if (i < n4) cpx<XH>(sm + i, xr + i, pf); }
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
  }
}

template <int T, int J, int XH, int WH, int YH, int MODE>
static int launch(const float* x, const float* w, const float* b, float* y, int O, long long N, void* wsbuf, float eps,
                  cudaStream_t s, int G, int window) {
  const int N4 = (int)(N / 4);
  const int chunk4 = (N4 + G - 1) / G;
  if (chunk4 > J * T || N % 4) return 2;
  auto k = ln_pipe<T, J, XH, WH, YH, MODE>;
  int K = 0;
  if (MODE & 4) K = (232448 - chunk4 * 16 - 1024) / 32;  // the rest of 227 KB, less the kernel's static part
  const int smem = chunk4 * 16 + K * 32;
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
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  if (window) {  // weight and bias contiguous (w, then b): keep them in L2's persisting part
    static bool once = false;
    if (!once) {
      cudaDeviceProp prop;
      cudaGetDeviceProperties(&prop, dev);
      cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, prop.persistingL2CacheMaxSize);
      printf("persisting L2 max %d bytes, window max %d\n", prop.persistingL2CacheMaxSize, prop.accessPolicyMaxWindowSize);
      once = true;
    }
    attr[1].id = cudaLaunchAttributeAccessPolicyWindow;
    attr[1].val.accessPolicyWindow.base_ptr = (void*)w;
    attr[1].val.accessPolicyWindow.num_bytes = (size_t)2 * N * 4;
    attr[1].val.accessPolicyWindow.hitRatio = window == 1 ? 1.0f : 0.6f;
    attr[1].val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    attr[1].val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  }
  cfg.gridDim = dim3(G);
  cfg.blockDim = dim3(T);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = window ? 2 : 1;
  cudaError_t e = cudaLaunchKernelEx(&cfg, k, (const float4*)x, (const float4*)w, (const float4*)b, (float4*)y, O, N4,
                                     chunk4, ws, cnt, eps, K);
  return e == cudaSuccess ? 0 : 10 + (int)e;
}

#define V(id, T, J, XH, WH, YH, M) case id: return launch<T, J, XH, WH, YH, M>(x, w, b, y, O, N, ws, eps, s, G, window);
extern "C" int ln_run(int variant, const float* x, const float* w, const float* b, float* y, int O, long long N,
                      void* ws, float eps, void* stream, int G) {
  cudaStream_t s = (cudaStream_t)stream;
  const int window = variant / 100;
  switch (variant % 100) {
    V(0, 1024, 8, 1, 1, 1, 0)
    V(1, 1024, 8, 1, 1, 1, 1)
    V(2, 1024, 8, 1, 1, 1, 2)
    V(3, 1024, 8, 1, 1, 1, 3)
    V(4, 512, 16, 0, 0, 0, 0)
    V(5, 512, 16, 0, 0, 0, 1)
    V(6, 512, 16, 0, 0, 0, 2)
    V(7, 512, 16, 0, 0, 0, 3)
    V(8, 1024, 8, 0, 0, 0, 0)
    V(9, 1024, 8, 1, 1, 1, 4)
    V(10, 512, 16, 0, 0, 0, 4)
    V(11, 512, 16, 1, 1, 1, 4)
    V(12, 512, 16, 1, 1, 1, 6)
    default: return 1;
  }
}
