// The grid layout's pipeline without most of its arithmetic: rows held in shared memory across a group of S
// co-resident blocks of one cooperative launch, each block a slice; per row nbar group barriers (a counter each, as the
// catalog's grid template waits on), then the output written from the slice. Modes:
//   0: the block refills its slice after the output; 1: each thread refills the positions it has just written out;
//   2: two buffers, the next row streaming in meanwhile;
//   3: split-phase barriers on three buffers (a block publishes row k's partial and arrives, then waits for row k-1's
//      barrier, arrived a step earlier, and writes row k-1 out while row k+1 streams into the third buffer);
//   4: the same on two buffers, row k+1 refilling row k-1's positions as they are written out;
//   5, 6, 7: mode 1 with the fill cut into 4, 8, 1 commit groups of each thread's own positions, the row's partial
//      taken part by part as it lands (what runner/catalog's `chunks` does);
//   8, 9: the catalog's structure step by step (vectors of 2 or 4 floats, NP passes, WORK 1: __expf, 2: expf).
// A bound for what runner/catalog/cuda_grid.py can reach on a shape, and a device copy of the same bytes beside it.
// Not part of fusebot: a measuring tool (results in bench/results/h100-catalog/README.md).
//
//   nvcc -O3 -arch=sm_90 -o grid_probe bench/grid_probe.cu
//   ./grid_probe ROWS ROW_ELEMS S THREADS NBAR MODE [memcpy|-] [WORK] [NP]
//   e.g. ./grid_probe 896 2097152 88 256 2 0 memcpy
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <string>
#include <cuda_pipeline.h>

__device__ __forceinline__ void fill(float4* buf, const float4* src, long long n4) {
  for (long long i = threadIdx.x; i < n4; i += blockDim.x) __pipeline_memcpy_async(buf + i, src + i, 16);
}

__device__ __forceinline__ void group_bar(unsigned* c, int S) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(c, 1u);
    while (*(volatile unsigned*)c < (unsigned)S) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();
}

__global__ void probe(const float4* x, float4* y, long long O, long long R4, int S, long long chunk4, unsigned* cnt,
                      int nbar, int mode /*0 plain, 1 refill, 2 two buffers*/) {
  extern __shared__ __align__(16) float4 sm[];
  const long long groups = gridDim.x / S;
  const int slice = blockIdx.x % S;
  const long long lo = slice * chunk4, hi = min(lo + chunk4, R4), n4 = hi > lo ? hi - lo : 0;
  int b = 0;
  long long row = blockIdx.x / S;
  if (row < O) fill(sm, x + row * R4 + lo, n4);
  __pipeline_commit();
  for (; row < O; row += groups) {
    float4* buf = sm + b * chunk4;
    if (mode == 2) {
      if (row + groups < O) fill(sm + (b ^ 1) * chunk4, x + (row + groups) * R4 + lo, n4);
      __pipeline_commit();
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    float s = 0.f;
    for (long long i = threadIdx.x; i < n4; i += blockDim.x) { float4 v = buf[i]; s += v.x + v.y + v.z + v.w; }
    for (int k = 0; k < nbar; ++k) group_bar(&cnt[row * 4 + k], S);
    const float m = 1.0001f + (s == 12345.f ? 1.f : 0.f);
    const bool next = row + groups < O;
    for (long long i = threadIdx.x; i < n4; i += blockDim.x) {
      float4 v = buf[i];
      v.x *= m; v.y *= m; v.z *= m; v.w *= m;
      y[row * R4 + lo + i] = v;
      if (mode == 1 && next) __pipeline_memcpy_async(buf + i, x + (row + groups) * R4 + lo + i, 16);
    }
    if (mode == 1) __pipeline_commit();
    if (mode == 0) {
      __syncthreads();
      if (next) fill(buf, x + (row + groups) * R4 + lo, n4);
      __pipeline_commit();
    }
    if (mode == 2) { __syncthreads(); b ^= 1; }
  }
}

__device__ __forceinline__ float block_sum(float v, float* red) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += red[w];
  return t;
}

// modes 3 and 4: split-phase barriers, rows g, g + groups, ... of this block's group in steps k = 0, 1, ...
__global__ void piped(const float4* x, float4* y, long long O, long long R4, int S, long long chunk4, unsigned* cnt,
                      float* part, int nb) {
  extern __shared__ __align__(16) float4 sm[];
  __shared__ float red[32];
  const long long groups = gridDim.x / S;
  const int slice = blockIdx.x % S;
  const long long lo = slice * chunk4, hi = min(lo + chunk4, R4), n4 = hi > lo ? hi - lo : 0;
  const long long g = blockIdx.x / S;
  if (g >= O) return;
  const long long steps = (O - 1 - g) / groups + 1;
  fill(sm, x + g * R4 + lo, n4);
  __pipeline_commit();
  for (long long k = 0; k <= steps; ++k) {
    const long long row = g + k * groups, prev = row - groups;
    if (nb == 3) {
      if (k + 1 < steps) fill(sm + ((k + 1) % 3) * chunk4, x + (row + groups) * R4 + lo, n4);
      __pipeline_commit();
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    if (k < steps) {  // row k: partial, published, arrive
      const float4* buf = sm + (k % nb) * chunk4;
      float s = 0.f;
      for (long long i = threadIdx.x; i < n4; i += blockDim.x) { float4 v = buf[i]; s += v.x + v.y + v.z + v.w; }
      s = block_sum(s, red);
      if (threadIdx.x == 0) { part[row * S + slice] = s; __threadfence(); atomicAdd(&cnt[row], 1u); }
    }
    if (k > 0) {  // row k-1: wait, gather, write out
      if (threadIdx.x == 0) {
        while (*(volatile unsigned*)&cnt[prev] < (unsigned)S) __nanosleep(32);
        __threadfence();
      }
      __syncthreads();
      float t = 0.f;
      for (int q = threadIdx.x; q < S; q += blockDim.x) t += __ldcg(&part[prev * S + q]);
      t = block_sum(t, red);
      const float m = 1.0001f + (t == 12345.f ? 1.f : 0.f);
      float4* buf = sm + ((k - 1) % nb) * chunk4;
      const bool refill = nb == 2 && k + 1 < steps;
      for (long long i = threadIdx.x; i < n4; i += blockDim.x) {
        float4 v = buf[i];
        v.x *= m; v.y *= m; v.z *= m; v.w *= m;
        y[prev * R4 + lo + i] = v;
        if (refill) __pipeline_memcpy_async(buf + i, x + (row + groups) * R4 + lo + i, 16);
      }
      if (nb == 2) __pipeline_commit();
    }
    __syncthreads();
  }
}

// modes 5, 6, 7: one buffer refilled as it is written out (mode 1), the fill and the refill cut into K commit groups
// of each thread's own positions (5: K = 4, 6: 8, 7: 1), so the row's partial runs part by part as the slice arrives
// (no block barrier before it); work 1: an __expf per element in both passes (softmax-like arithmetic), 0: trivial
template <int K>
__global__ void chunked(const float4* x, float4* y, long long O, long long R4, int S, long long chunk4, unsigned* cnt,
                        int nbar, int work) {
  extern __shared__ __align__(16) float4 sm[];
  const long long groups = gridDim.x / S;
  const int slice = blockIdx.x % S;
  const long long lo = slice * chunk4, hi = min(lo + chunk4, R4), n4 = hi > lo ? hi - lo : 0;
  long long row = blockIdx.x / S;
  if (row >= O) return;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    for (long long i = k * n4 / K + ((threadIdx.x - k * n4 / K) % blockDim.x + blockDim.x) % blockDim.x;
         i < (k + 1) * n4 / K; i += blockDim.x)
      __pipeline_memcpy_async(sm + i, x + row * R4 + lo + i, 16);
    __pipeline_commit();
  }
  for (; row < O; row += groups) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      __pipeline_wait_prior(K - 1 - k);
      for (long long i = k * n4 / K + ((threadIdx.x - k * n4 / K) % blockDim.x + blockDim.x) % blockDim.x;
           i < (k + 1) * n4 / K; i += blockDim.x) {
        float4 v = sm[i];
        if (work) s += __expf(v.x) + __expf(v.y) + __expf(v.z) + __expf(v.w);
        else s += v.x + v.y + v.z + v.w;
      }
    }
    __shared__ float red[32];
    s = block_sum(s, red);
    for (int k = 0; k < nbar; ++k) group_bar(&cnt[row * 4 + k], S);
    const float m = 1.0001f + (s == 12345.f ? 1.f : 0.f);
    const bool next = row + groups < O;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      for (long long i = k * n4 / K + ((threadIdx.x - k * n4 / K) % blockDim.x + blockDim.x) % blockDim.x;
           i < (k + 1) * n4 / K; i += blockDim.x) {
        float4 v = sm[i];
        if (work) { v.x = __expf(v.x - m); v.y = __expf(v.y - m); v.z = __expf(v.z - m); v.w = __expf(v.w - m); }
        else { v.x *= m; v.y *= m; v.z *= m; v.w *= m; }
        y[row * R4 + lo + i] = v;
        if (next) __pipeline_memcpy_async(sm + i, x + (row + groups) * R4 + lo + i, 16);
      }
      __pipeline_commit();
    }
  }
}

template <int V> struct alignas(4 * V) FbV { float v[V]; };

// modes 8 (V = 2), 9 (V = 4): the catalog's cluster/grid structure step by step, to find what costs:
// vectors of V floats (cp.async of 4V bytes), NP passes over the slice before the output (each with an expf per
// element when work is 1, accurate expf when work is 2), nbar group barriers, refill as written
template <int V>
__global__ void like(const float* x, float* y, long long O, long long R, int S, long long chunk, unsigned* cnt,
                     int nbar, int work, int np) {
  extern __shared__ __align__(16) float smf[];
  typedef FbV<V> Vt;
  const long long groups = gridDim.x / S;
  const int slice = blockIdx.x % S;
  const long long lo = slice * chunk, hi = min(lo + chunk, R), n = hi > lo ? hi - lo : 0;
  long long row = blockIdx.x / S;
  if (row >= O) return;
  for (long long i = threadIdx.x * V; i < n; i += blockDim.x * V)
    __pipeline_memcpy_async(smf + i, x + row * R + lo + i, 4 * V);
  __pipeline_commit();
  __shared__ float red[32];
  for (; row < O; row += groups) {
    __pipeline_wait_prior(0);
    __syncthreads();
    float tot = 0.f;
    for (int q = 0; q < np; ++q) {
      float s = 0.f;
      for (long long i = threadIdx.x * V; i < n; i += blockDim.x * V) {
        Vt v = *(const Vt*)(smf + i);
#pragma unroll
        for (int j = 0; j < V; ++j)
          s += work == 2 ? expf(v.v[j] - tot) : work == 1 ? __expf(v.v[j] - tot) : v.v[j];
      }
      s = block_sum(s, red);
      if (q < nbar) group_bar(&cnt[row * 4 + q], S);
      tot += s;
    }
    const float m = 1.0001f + (tot == 12345.f ? 1.f : 0.f);
    const bool next = row + groups < O;
    for (long long i = threadIdx.x * V; i < n; i += blockDim.x * V) {
      Vt v = *(const Vt*)(smf + i);
#pragma unroll
      for (int j = 0; j < V; ++j) v.v[j] = work == 2 ? expf(v.v[j] - m) : work == 1 ? __expf(v.v[j] - m) : v.v[j] * m;
      *(Vt*)(y + row * R + lo + i) = v;
      if (next) __pipeline_memcpy_async(smf + i, x + (row + groups) * R + lo + i, 4 * V);
    }
    __pipeline_commit();
    __syncthreads();
  }
}

int main(int argc, char** argv) {
  long long O = atoll(argv[1]), R = atoll(argv[2]);
  int S = atoi(argv[3]), T = atoi(argv[4]), nbar = atoi(argv[5]), mode = atoi(argv[6]);
  long long R4 = R / 4, chunk4 = (R4 + S - 1) / S;
  float4 *x, *y; unsigned* cnt; float* part;
  cudaMalloc(&x, O * R * 4); cudaMalloc(&y, O * R * 4); cudaMalloc(&cnt, O * 16);
  cudaMalloc(&part, O * 4 * 1024);
  cudaMemset(x, 0, O * R * 4);
  const int nb = mode == 3 ? 3 : mode == 2 || mode == 4 ? 2 : 1;
  int work = argc > 8 ? atoi(argv[8]) : 0, np = argc > 9 ? atoi(argv[9]) : 1;
  size_t smem = chunk4 * 16 * nb;
  void* kfn = mode == 5 ? (void*)chunked<4> : mode == 6 ? (void*)chunked<8> : mode == 7 ? (void*)chunked<1>
              : mode == 8 ? (void*)like<2> : mode == 9 ? (void*)like<4> : mode >= 3 ? (void*)piped : (void*)probe;
  cudaFuncSetAttribute(kfn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  int per_sm = 0, sms = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kfn, T, smem);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  long long groups = std::min<long long>(O, (long long)per_sm * sms / S);
  if (groups < 1) { printf("O=%lld R=%lld S=%d T=%d: does not fit (per_sm %d, smem %zu)\n", O, R, S, T, per_sm, smem); return 0; }
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> ts;
  for (int it = 0; it < 7; ++it) {
    cudaMemsetAsync(cnt, 0, O * 16);
    void* args[] = {&x, &y, &O, &R4, &S, &chunk4, &cnt, &nbar, &mode};
    void* pargs[] = {&x, &y, &O, &R4, &S, &chunk4, &cnt, &part, (void*)&nb};
    void* cargs[] = {&x, &y, &O, &R4, &S, &chunk4, &cnt, &nbar, &work};
    long long chunk = chunk4 * 4;
    void* largs[] = {&x, &y, &O, &R, &S, &chunk, &cnt, &nbar, &work, &np};
    cudaEventRecord(e0);
    void** kargs = mode >= 8 ? largs : mode >= 5 ? cargs : mode >= 3 ? pargs : args;
    cudaLaunchCooperativeKernel(kfn, dim3(groups * S), dim3(T), kargs, smem, 0);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    if (it >= 2) ts.push_back(ms);
  }
  cudaError_t err = cudaGetLastError();
  std::sort(ts.begin(), ts.end());
  double gb = 2.0 * O * R * 4 / 1e9;
  printf("O=%lld R=%lld S=%d T=%d per_sm=%d groups=%lld smem=%zuKB nbar=%d mode=%d work=%d np=%d: median %.3f ms (%.2f TB/s) %s\n", O, R,
         S, T, per_sm, groups, smem / 1024, nbar, mode, work, np, ts[2], gb / ts[2], cudaGetErrorString(err));
  // reference: a device copy of the same bytes
  cudaEventRecord(e0);
  cudaMemcpyAsync(y, x, O * R * 4, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1); cudaEventSynchronize(e1);
  float ms; cudaEventElapsedTime(&ms, e0, e1);
  if (argc > 7 && std::string(argv[7]) == "memcpy") printf("  memcpy %.3f ms (%.2f TB/s)\n", ms, gb / ms);
  return 0;
}
