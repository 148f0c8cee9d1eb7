// fusebot's launch recorder: linked into a kernel's host code (runner/harness/launch_plan.py) in place of the
// CUDA runtime's launch entry points, so that fusebot_forward, called on descriptors of the verified shapes with
// stand-in pointers, writes down what it would launch (kernel, grid, block, shared memory, parameter bytes, memsets)
// instead of launching it. The drop-in replays that through the driver API from the shipped cubin; no host code ships.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <map>
#include <string>
#include <vector>

namespace {
std::string g_rec;  // one line per step
struct Param { int offset, size; };
struct Kernel { std::string name; std::vector<Param> params; };
std::map<const void*, Kernel> g_kernels;  // host function -> the kernel's name and parameters (from the cubin)

std::string name_of(const void* f) {
  auto it = g_kernels.find(f);
  return it == g_kernels.end() ? std::string("?") : it->second.name;
}

void hex(std::string& s, const unsigned char* p, size_t n) {
  static const char* d = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) { s += d[p[i] >> 4]; s += d[p[i] & 15]; }
}

void launch_line(const void* func, dim3 g, dim3 b, size_t shmem, void** args, int coop, unsigned cx, unsigned cy,
                 unsigned cz) {
  auto it = g_kernels.find(func);
  if (it == g_kernels.end()) { g_rec += "unknown kernel\n"; return; }
  const std::vector<Param>& ps = it->second.params;
  int total = 0;
  for (const Param& p : ps) total = p.offset + p.size > total ? p.offset + p.size : total;
  std::vector<unsigned char> buf((size_t)total, 0);
  for (size_t i = 0; i < ps.size(); ++i) memcpy(buf.data() + ps[i].offset, args[i], ps[i].size);
  char head[512];
  snprintf(head, sizeof head, "launch %s %u %u %u %u %u %u %zu %d %u %u %u ", it->second.name.c_str(), g.x, g.y, g.z, b.x, b.y,
           b.z, shmem, coop, cx, cy, cz);
  g_rec += head;
  hex(g_rec, buf.data(), buf.size());
  g_rec += "\n";
}
}  // namespace

extern "C" {
// the library's load address: a kernel's host function is this plus its .symtab value (nvcc hides the symbols)
__attribute__((visibility("default"))) const void* fusebot_record_base(void) {
  Dl_info info;
  return dladdr((const void*)&fusebot_record_base, &info) ? info.dli_fbase : 0;
}

__attribute__((visibility("default"))) void fusebot_record_params(const void* func, const char* name, int n,
                                                                   const int* offsets, const int* sizes) {
  Kernel& k = g_kernels[func];
  k.name = name;
  k.params.clear();
  for (int i = 0; i < n; ++i) k.params.push_back({offsets[i], sizes[i]});
}

__attribute__((visibility("default"))) const char* fusebot_record_take(void) {
  static std::string out;
  out.swap(g_rec);
  g_rec.clear();
  return out.c_str();
}

// nvcc 13's launch stubs: a handle per kernel, then a launch by handle (the handle here is the host function)
cudaError_t __cudaGetKernel(cudaKernel_t* handle, const void* func) {
  *handle = (cudaKernel_t)func;
  return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 g, dim3 b, void** args, size_t shmem, cudaStream_t) {
  launch_line((const void*)kernel, g, b, shmem, args, 0, 1, 1, 1);
  return cudaSuccess;
}

cudaError_t cudaLaunchKernel(const void* func, dim3 g, dim3 b, void** args, size_t shmem, cudaStream_t) {
  launch_line(func, g, b, shmem, args, 0, 1, 1, 1);
  return cudaSuccess;
}

cudaError_t cudaLaunchCooperativeKernel(const void* func, dim3 g, dim3 b, void** args, size_t shmem, cudaStream_t) {
  launch_line(func, g, b, shmem, args, 1, 1, 1, 1);
  return cudaSuccess;
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* cfg, const void* func, void** args) {
  int coop = 0;
  unsigned cx = 1, cy = 1, cz = 1;
  for (unsigned i = 0; i < cfg->numAttrs; ++i) {
    const cudaLaunchAttribute& a = cfg->attrs[i];
    if (a.id == cudaLaunchAttributeCooperative) coop = a.val.cooperative;
    else if (a.id == cudaLaunchAttributeClusterDimension) { cx = a.val.clusterDim.x; cy = a.val.clusterDim.y; cz = a.val.clusterDim.z; }
    else { g_rec += "unsupported launch attribute\n"; return cudaSuccess; }
  }
  launch_line(func, cfg->gridDim, cfg->blockDim, cfg->dynamicSmemBytes, args, coop, cx, cy, cz);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  char line[128];
  snprintf(line, sizeof line, "memset %llu %d %zu\n", (unsigned long long)p, value, bytes);
  g_rec += line;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  char line[256];
  snprintf(line, sizeof line, "attribute %s %d %d\n", name_of(func).c_str(), (int)attr, value);
  g_rec += line;
  typedef cudaError_t (*real_t)(const void*, cudaFuncAttribute, int);
  real_t real = (real_t)dlsym(RTLD_NEXT, "cudaFuncSetAttribute");  // occupancy queries see the attribute too
  if (real) (void)real(func, attr, value);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** p, size_t, cudaStream_t) {
  g_rec += "unsupported allocation\n";
  *p = 0;
  return cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeAsync(void*, cudaStream_t) { return cudaSuccess; }

// memory of its own and copies through the host: a plan cannot hold them (an address from this process, data read
// while recording), so a launcher that uses them gets no device code
cudaError_t cudaMalloc(void** p, size_t) {
  g_rec += "unsupported allocation\n";
  *p = 0;
  return cudaErrorMemoryAllocation;
}

cudaError_t cudaMemcpy(void*, const void*, size_t, cudaMemcpyKind) {
  g_rec += "unsupported copy\n";
  return cudaErrorInvalidValue;
}

cudaError_t cudaMemcpyAsync(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t) {
  g_rec += "unsupported copy\n";
  return cudaErrorInvalidValue;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }  // nothing was launched: no launch error to report
}
