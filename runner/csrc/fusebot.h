/* fusebot's plain C ABI for fast-format kernels: no torch headers, built by nvcc or the system C++ compiler.
 *
 * A kernel library exports
 *   extern "C" int fusebot_forward(const fb_tensor* inputs, int32_t n_inputs,
 *                                  fb_tensor* outputs, int32_t n_outputs, void* stream);
 * `inputs` are the module's forward arguments followed by its parameters and buffers in state_dict order; a Python
 * number among the forward arguments arrives as a 0-dim tensor on the same device. `outputs` are allocated by the
 * caller: contiguous, with the reference's shapes and dtypes, filled with garbage the kernel must overwrite.
 * `stream` is the caller's cudaStream_t (NULL on the CPU backend): launch every kernel on it, and on nothing else.
 * Return 0 on success; any other value is an error, described by fusebot_last_error() when the library exports it.
 *
 * Optional exports, each looked up by name (a library without them is called as above):
 *   const char* fusebot_last_error(void);
 *       what the last failed call on this thread refused or failed on.
 *   void fusebot_set_workspace(void* ptr, size_t bytes);
 *   size_t fusebot_workspace_need(void);
 *       device scratch memory from the caller (the drop-in takes it from torch's caching allocator, on the tensors'
 *       device and ordered on `stream`), for the next fusebot_forward on this thread; ptr NULL, bytes 0: none. A
 *       library that needs more than it was given returns nonzero (or takes a path without scratch memory) and
 *       reports the bytes it wanted through fusebot_workspace_need(); the caller gives that much next time. Without
 *       fusebot_set_workspace before a call, the library allocates for itself.
 */
#ifndef FUSEBOT_H
#define FUSEBOT_H
#include <stddef.h>
#include <stdint.h>

#define FB_MAX_DIMS 8

enum fb_dtype {
  FB_FLOAT32 = 0,
  FB_FLOAT16 = 1,
  FB_BFLOAT16 = 2,
  FB_FLOAT64 = 3,
  FB_INT32 = 4,
  FB_INT64 = 5,
  FB_BOOL = 6,
  FB_UINT8 = 7,
  FB_INT8 = 8,
};

typedef struct fb_tensor {
  void* data;
  int32_t dtype;                  /* enum fb_dtype */
  int32_t ndim;
  int64_t shape[FB_MAX_DIMS];
  int64_t strides[FB_MAX_DIMS];   /* in elements */
} fb_tensor;

#ifdef __cplusplus
#define FB_EXPORT extern "C" __attribute__((visibility("default")))
#else
#define FB_EXPORT __attribute__((visibility("default")))
#endif

#endif /* FUSEBOT_H */
