// The grid layout's pipeline without its arithmetic: rows held in shared memory across a group of S co-resident
// blocks of one cooperative launch, each block a slice; per row nbar group barriers (a counter each, as the catalog's
// grid template waits on), then the output written from the slice (input times a constant). mode 0: the block refills
// its slice after the output; 1: each thread refills the positions it has just written out; 2: two buffers, the next
// row streaming in meanwhile. A bound for what runner/catalog/cuda_grid.py can reach on a shape, and a device copy of
// the same bytes beside it. Not part of fusebot: a measuring tool (results in bench/results/h100-catalog/README.md).
//
//   nvcc -O3 -arch=sm_90 -o grid_probe bench/grid_probe.cu
//   ./grid_probe ROWS ROW_ELEMS S THREADS NBAR MODE [memcpy]     e.g. ./grid_probe 896 2097152 88 256 2 0 memcpy
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
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

int main(int argc, char** argv) {
  long long O = atoll(argv[1]), R = atoll(argv[2]);
  int S = atoi(argv[3]), T = atoi(argv[4]), nbar = atoi(argv[5]), mode = atoi(argv[6]);
  long long R4 = R / 4, chunk4 = (R4 + S - 1) / S;
  float4 *x, *y; unsigned* cnt;
  cudaMalloc(&x, O * R * 4); cudaMalloc(&y, O * R * 4); cudaMalloc(&cnt, O * 16);
  cudaMemset(x, 0, O * R * 4);
  size_t smem = chunk4 * 16 * (mode == 2 ? 2 : 1);
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  int per_sm = 0, sms = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, probe, T, smem);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  long long groups = std::min<long long>(O, (long long)per_sm * sms / S);
  if (groups < 1) { printf("O=%lld R=%lld S=%d T=%d: does not fit (per_sm %d, smem %zu)\n", O, R, S, T, per_sm, smem); return 0; }
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> ts;
  for (int it = 0; it < 7; ++it) {
    cudaMemsetAsync(cnt, 0, O * 16);
    void* args[] = {&x, &y, &O, &R4, &S, &chunk4, &cnt, &nbar, &mode};
    cudaEventRecord(e0);
    cudaLaunchCooperativeKernel((void*)probe, dim3(groups * S), dim3(T), args, smem, 0);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    if (it >= 2) ts.push_back(ms);
  }
  cudaError_t err = cudaGetLastError();
  std::sort(ts.begin(), ts.end());
  double gb = 2.0 * O * R * 4 / 1e9;
  printf("O=%lld R=%lld S=%d T=%d per_sm=%d groups=%lld smem=%zuKB nbar=%d mode=%d: median %.3f ms (%.2f TB/s) %s\n", O, R,
         S, T, per_sm, groups, smem / 1024, nbar, mode, ts[2], gb / ts[2], cudaGetErrorString(err));
  // reference: a device copy of the same bytes
  cudaEventRecord(e0);
  cudaMemcpyAsync(y, x, O * R * 4, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1); cudaEventSynchronize(e1);
  float ms; cudaEventElapsedTime(&ms, e0, e1);
  if (argc > 7) printf("  memcpy %.3f ms (%.2f TB/s)\n", ms, gb / ms);
  return 0;
}
