"""Fast-format C++ answers for tests/fixtures/problems/affine_relu_chain_small.py (y = (relu(x * 2 + 1) - 0.25) * 3), as a
model would write them: an honest one-pass kernel, one that does not build, one that forgets the ReLU, and an honest
but slow one."""

from pathlib import Path

PROBLEM = Path(__file__).resolve().parents[1] / "fixtures/problems/affine_relu_chain_small.py"

GOOD = r'''#include "fusebot.h"

// One pass over x: y = (max(x * 2 + 1, 0) - 0.25) * 3.  variant: %s
FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  (void)stream;
  if (n_in != 1 || n_out != 1) return 1;
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] * 2.0f + 1.0f;
    y[i] = ((v < 0.0f ? 0.0f : v) - 0.25f) * 3.0f;
  }
  return 0;
}
'''

BROKEN = GOOD.replace("float v =", "flaot v =")
WRONG = GOOD.replace("(v < 0.0f ? 0.0f : v)", "v")
SLOW = GOOD.replace("  return 0;\n}", "  for (volatile long k = 0; k < 20000000L; ++k) {}\n  return 0;\n}")  # ~5x eager


def answer(code: str, variant: str = "a", tag: str = "cpp") -> str:
    body = code % variant if "%s" in code else code
    return f"Here is a fused kernel.\n\n```{tag}\n{body}```\n\nIt reads each input once."
