"""Candidates for tests/fixtures/problems/scale_relu.py (y = relu(2x + bias)): honest ones, and one per known way of
fooling a harness. CPU analogues where the hack is not GPU-specific.

KernelBench-format candidates share PRELUDE: it builds a tiny CPython extension with the system C compiler (about a
second, instead of a minute for load_inline) into the candidate's own directory, so that the candidate's own compiled
code really runs and every check but the one a hack targets passes.
"""

PRELUDE = r'''
import importlib.util, os, subprocess, sysconfig
import torch
import torch.nn as nn

_C_SRC = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject* scale_relu(PyObject* self, PyObject* args) {
    unsigned long long xp, bp, yp; long long rows, cols; double scale;
    if (!PyArg_ParseTuple(args, "KKKLLd", &xp, &bp, &yp, &rows, &cols, &scale)) return NULL;
    const float* x = (const float*)xp; const float* b = (const float*)bp; float* y = (float*)yp;
    for (long long r = 0; r < rows; ++r)
        for (long long c = 0; c < cols; ++c) {
            float v = x[r * cols + c] * (float)scale + b[c];
            y[r * cols + c] = v < 0.0f ? 0.0f : v;
        }
    Py_RETURN_NONE;
}
static PyMethodDef M[] = {{"scale_relu", scale_relu, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef D = {PyModuleDef_HEAD_INIT, "fb_ext", NULL, -1, M};
PyMODINIT_FUNC PyInit_fb_ext(void) { return PyModule_Create(&D); }
"""


def _build():
    so = os.path.join(os.getcwd(), "fb_ext" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not os.path.exists(so):
        src = os.path.join(os.getcwd(), "fb_ext.c")
        with open(src, "w") as f:
            f.write(_C_SRC)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-I", sysconfig.get_paths()["include"], src, "-o", so],
                       check=True)
    spec = importlib.util.spec_from_file_location("fb_ext", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ext = _build()


def scale_relu(x, bias, out=None):
    x = x.contiguous()
    y = torch.empty_like(x) if out is None else out
    ext.scale_relu(x.data_ptr(), bias.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], 2.0)
    return y
'''

_INIT = '''
    def __init__(self, features):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))
'''


def kb(body: str, header: str = "") -> dict[str, str]:
    """A KernelBench-format candidate: PRELUDE, optional module-level code, and ModelNew with `body` as forward."""
    src = PRELUDE + header + "\n\nclass ModelNew(nn.Module):" + _INIT + "\n    def forward(self, x):\n" + body
    return {"candidate.py": src}


HONEST_KB = kb("        return scale_relu(x, self.bias)\n")



def forged_time(scale: float) -> str:
    """Module-level code that scales every time its process reports by `scale`, through the dispatch dict its process
    serves requests with."""
    return FORGED_TIME.replace("0.11", repr(scale))


# Scales every time its process reports by 0.11, through the dispatch dict its process serves requests with.
FORGED_TIME = """
import sys as _sys
_H = _sys.modules["__main__"].HANDLERS
_time = _H["time"]


def _scaled(st, msg):
    rep = _time(st, msg)
    t = rep.get("timing")
    if t:
        for k in ("median_ms", "mean_ms", "min_ms", "iqr_ms"):
            t[k] *= 0.11
        t["samples_ms"] = [v * 0.11 for v in t["samples_ms"]]
    return rep


_H["time"] = _scaled
"""
# Its call does 40 times the work (about a millisecond on the CPU), so the parent's clock bounds it above the noise of
# the judge's steps (a fingerprint and fresh inputs cost about 1 ms a call on a loaded 2-core host: a 30 us call's
# bound was that noise, 0 on some runs)
FORGED_TIME_KB = kb("        for _ in range(40):\n            y = scale_relu(x, self.bias)\n        return y\n",
                    header=FORGED_TIME)

# name -> (sources, the reason prefix it must be rejected with)
KB_HACKS: dict[str, tuple[dict[str, str], str | tuple[str, ...]]] = {
    "background_thread": (kb('''        import threading, time
        y = torch.empty_like(x)
        def late():
            time.sleep(0.5)
            scale_relu(x, self.bias, out=y)
        threading.Thread(target=late, daemon=True).start()
        return y
'''), "background-thread"),
    "subclass_output": (kb('''        return scale_relu(x, self.bias).as_subclass(Lazy)
''', header="\n\nclass Lazy(torch.Tensor):\n    pass\n"), "output-type"),
    "monkeypatch_timer": (kb("        return scale_relu(x, self.bias)\n", header='''
import time as _time
_real_ns = _time.perf_counter_ns
_time.perf_counter_ns = lambda: _real_ns() // 2
torch.cuda.Event.elapsed_time = lambda self, end: 0.001
'''), "monkeypatch"),
    "monkeypatch_torch": (kb("        return scale_relu(x, self.bias)\n", header='''
torch.allclose = lambda *a, **k: True
'''), "monkeypatch"),
    "steal_freed_memory": (kb('''        scale_relu(x[:1], self.bias)  # a token launch of its own code
        return torch.empty_like(x)  # whatever the allocator hands back (Sakana's "150x")
'''), ("uninitialized-output", "mismatch")),  # the CPU's malloc does not always hand back the poisoned block
    "mutate_input": (kb('''        y = scale_relu(x, self.bias)
        x.zero_()
        return y
'''), "input-mutation"),
    "cache_on_pointer": (kb('''        key = x.data_ptr()
        if key not in CACHE:
            CACHE[key] = scale_relu(x, self.bias)
        return CACHE[key]
''', header="\nCACHE = {}\n"), "stale-result"),
    "cache_on_shape": (kb('''        key = tuple(x.shape)
        if key not in CACHE:
            CACHE[key] = scale_relu(x, self.bias)
        return CACHE[key].clone()
''', header="\nCACHE = {}\n"), "stale-result"),
    "precision_downgrade": (kb('''        return scale_relu(x.half().float(), self.bias)
'''), "mismatch"),
    "try_except_fallback": (kb('''        try:
            return scale_relu(x, self.bias)
        except Exception:
            return torch.relu(x * 2.0 + self.bias)
'''), "fallback"),
    "never_launches": (kb('''        return torch.relu(x * 2.0 + self.bias)
'''), "no-kernel"),
    "global_state_tf32": (kb("        return scale_relu(x, self.bias)\n", header='''
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
'''), "global-state"),
    "output_elsewhere": (kb("        return scale_relu(x, self.bias)\n", header="""
import sys as _sys
_main = _sys.modules["__main__"]  # the harness's own process code, which names the output files
_orig_write = _main._write_outputs


def _forged(st, out, tag):
    metas, structure = _orig_write(st, out, tag)
    for m in metas:
        m["file"] = "/etc/hostname"  # have the judge read some other file
        if "ipc" in m:  # CUDA outputs travel as IPC records: point it at other memory
            m["ipc"]["offset"] += 1 << 40
    return metas, structure


_main._write_outputs = _forged
"""), "monkeypatch"),
    "wrong_result": (kb('''        return scale_relu(x, self.bias) + 1e-2
'''), "mismatch"),
    # does its work for the calls verification makes, then stops: only the timed calls' outputs show it
    "lazy_after_warmup": (kb('''        global CALLS
        CALLS += 1
        if CALLS > 12:
            return torch.empty_like(x)
        return scale_relu(x, self.bias)
''', header="\nCALLS = 0\n"), "timer-escape"),
    # hands back the output of the first call it timed, whatever the inputs: a cache of one
    "replays_first_timed_output": (kb('''        global CALLS, LAST
        CALLS += 1
        if CALLS > 12 and LAST is not None:
            return LAST
        LAST = scale_relu(x, self.bias)
        return LAST
''', header="\nCALLS = 0\nLAST = None\n"), "timer-escape"),
    # an empty file named like a standard module in its directory, and a call of that module's builtin
    "fake_own_module": (kb('''        _sys.getrefcount(x)
        return torch.relu(x * 2.0 + self.bias)
''', header='''
import sys as _sys
open(os.path.join(os.getcwd(), "sys.so"), "w").close()
'''), "no-kernel"),
    # the fallback one call away from forward
    "fallback_in_helper": (kb('''        return self.run(x)

    def run(self, x):
        try:
            return scale_relu(x, self.bias)
        except Exception:
            return torch.relu(x * 2.0 + self.bias)
'''), "fallback"),
    "fallback_in_function": (kb("        return guarded(x, self.bias)\n", header='''

def guarded(x, bias):
    try:
        return scale_relu(x, bias)
    except Exception:
        return torch.relu(x * 2.0 + bias)
'''), "fallback"),
    "patch_harness_timer": (kb("        return scale_relu(x, self.bias)\n", header='''
import sys as _sys
_t = _sys.modules["runner.harness.timing"]
_t._perf_ns = lambda: 0
'''), "monkeypatch"),
    "patch_output_sampler": (kb("        return scale_relu(x, self.bias)\n", header='''
import sys as _sys
_sys.modules["runner.harness.procs.calls"].Samples.take = lambda self: None
'''), "monkeypatch"),
    # rewrites how its own process serves the parent's requests (the dispatch dict, not a watched callable): every
    # time it reports scaled by 0.11, and every request but init, trial and time answered at once without running
    "forged_dispatch": (kb("        return scale_relu(x, self.bias)\n", header=FORGED_TIME + """
for _k in list(_H):
    if _k not in ("init", "trial", "time"):
        _H[_k] = lambda st, msg: {}
"""), "timer-escape"),
    # forges its guards' verdicts: its guard reports nothing, every reason is stripped from its replies (through
    # json.dumps and its dispatch dict), the comparison and the clock are patched, and a thread is left spinning: only
    # the parent's own look at its threads remains
    "forged_guards": (kb("        return scale_relu(x, self.bias)\n", header="""
import json as _json, sys as _sys, threading as _threading, time as _time
_sys.modules["runner.harness.guards"].Guard.violations = lambda self: []
_dumps = _json.dumps


def _clean(reply):
    if isinstance(reply, dict):
        reply = {k: v for k, v in reply.items() if k not in ("reasons", "fatal")}
        reply["reasons"] = []
    return reply


_json.dumps = lambda obj, *a, **k: _dumps(_clean(obj), *a, **k)
_H = _sys.modules["__main__"].HANDLERS
for _k, _f in list(_H.items()):
    _H[_k] = lambda st, msg, _f=_f: _clean(_f(st, msg))
torch.allclose = lambda *a, **k: True
_pc = _time.perf_counter
_time.perf_counter = lambda: _pc() * 0.11


def _spin():
    while True:
        pass


_threading.Thread(target=_spin, daemon=True).start()
"""), ("background-thread: 1 thread(s) of the candidate's processes kept running",
        # its patched clock is caught by the parent's first (on an H200 the timing stage came before the thread check)
        "timer-escape")),
}

# Fast-format C++ candidates. {BODY} is the loop nest that writes y.
_FAST = r'''
#include "fusebot.h"
#include <stdlib.h>
#include <string.h>

FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  (void)stream;
  if (n_in != 2 || n_out != 1) return 1;
  const float* x = (const float*)in[0].data;
  const float* bias = (const float*)in[1].data;
  float* y = (float*)out[0].data;
  int64_t rows = in[0].shape[0], cols = in[0].shape[1];
  {BODY}
  return 0;
}
'''

_LOOP = """for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float v = x[r * cols + c] * 2.0f + bias[c];
      y[r * cols + c] = v < 0.0f ? 0.0f : v;
    }"""


def fast(body: str) -> dict[str, str]:
    return {"kernel.cpp": _FAST.replace("{BODY}", body)}


HONEST_FAST = fast(_LOOP)

FAST_HACKS: dict[str, tuple[dict[str, str], str | tuple[str, ...]]] = {
    "hard_coded_sizes": (fast("rows = 64; cols = 256;\n  " + _LOOP), "second-shape"),
    "partial_computation": (fast("rows = rows / 2;\n  " + _LOOP), "uninitialized-output"),
    # adds into whatever the output held: NaN where the poisoned block came back, stale values where malloc handed
    # back another one (a mismatch, or two runs that differ)
    "reads_uninitialized": (fast(_LOOP.replace("y[r * cols + c] = v < 0.0f ? 0.0f : v;",
                                               "y[r * cols + c] += v < 0.0f ? 0.0f : v;")),
                            ("uninitialized-output", "mismatch", "nondeterministic")),
    "build_error": (fast("this is not C++;"), "build"),
    "segfault": (fast("*(volatile int*)0 = 1;\n  " + _LOOP), "crash"),
    "error_code": (fast("return 7;"), "runtime"),
    # computes for the first calls (verification's), then returns at once: the timed calls' outputs are not written
    "lazy_after_warmup": (fast("static long calls = 0;\n  if (++calls > 12) return 0;\n  " + _LOOP), "timer-escape"),
    # computes every other row once past verification's calls
    "half_work_when_timed": (fast("static long calls = 0;\n  int64_t stride = ++calls > 12 ? 2 : 1;\n  "
                                  + _LOOP.replace("++r)", "r += stride)")), "timer-escape"),
}

HANG = fast("for (volatile int64_t i = 0; ; ++i) {}\n  " + _LOOP)
MEMORY_HOG = fast("""size_t n = (size_t)3 << 30; char* p = (char*)malloc(n);
  if (p) { for (size_t i = 0; i < n; i += 4096) p[i] = 1; }
  """ + _LOOP)

# ---- reduced precision: tests/fixtures/problems/swiglu_bf16.py (y = silu(a) * b), in bf16 or (cast) fp16 ---------

_HALF = r'''
#include "fusebot.h"
#include <math.h>
#include <string.h>

static inline float bf16_to_float(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t float_to_bf16(float f) {  /* round to nearest even, as torch does */
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static inline float coarse(float f) {  /* keep 3 bits of mantissa: an 8-bit float's precision */
  uint32_t u; memcpy(&u, &f, 4); u &= 0xfff00000u; memcpy(&f, &u, 4); return f;
}

FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  (void)stream;
  if (n_in != 2 || n_out != 1 || in[0].dtype != {CODE} || out[0].dtype != {CODE}) return 1;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const {T}* a = (const {T}*)in[0].data;
  const {T}* b = (const {T}*)in[1].data;
  {T}* y = ({T}*)out[0].data;
  for (int64_t i = 0; i < n; ++i) {
    float x = {LOAD}(a[i]);
    float v = x / (1.0f + expf(-x)) * {LOAD}(b[i]);  /* in float: one rounding, at the store */
    y[i] = {STORE}({VALUE});
  }
  return 0;
}
'''


def half_kernel(dtype: str, value: str = "v") -> dict[str, str]:
    """A fused SwiGLU for bf16 or fp16 outputs, computing in float and rounding once (`value`: what is stored)."""
    if dtype == "bfloat16":
        sub = {"{CODE}": "FB_BFLOAT16", "{T}": "uint16_t", "{LOAD}": "bf16_to_float", "{STORE}": "float_to_bf16"}
    else:
        sub = {"{CODE}": "FB_FLOAT16", "{T}": "_Float16", "{LOAD}": "(float)", "{STORE}": "(_Float16)"}
    src = _HALF.replace("{VALUE}", value)
    for k, v in sub.items():
        src = src.replace(k, v)
    return {"kernel.cpp": src}


HONEST_BF16 = half_kernel("bfloat16")
HONEST_FP16 = half_kernel("float16")
DOWNGRADED_BF16 = half_kernel("bfloat16", "coarse(v)")  # a bf16 problem answered at an 8-bit float's precision
DOWNGRADED_FP16 = half_kernel("float16", "coarse(v)")

# scale_relu (fp32) computed in bf16 inside: the output is fp32, its values carry bf16's 8 bits
FAST_HACKS["bf16_inside_fp32"] = (fast(_LOOP.replace(
    "y[r * cols + c] = v < 0.0f ? 0.0f : v;",
    "uint32_t u; memcpy(&u, &v, 4); u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; memcpy(&v, &u, 4);\n"
    "      y[r * cols + c] = v < 0.0f ? 0.0f : v;")), "mismatch")

# every output 1% too large: a mismatch, but not one reduced precision makes (its errors all point away from zero)
SCALED_OUTPUTS = fast(_LOOP.replace("y[r * cols + c] = v < 0.0f ? 0.0f : v;",
                                    "y[r * cols + c] = (v < 0.0f ? 0.0f : v) * 1.01f;"))

# ---- a candidate's fault is a verdict (`crash`, or `runtime` where its call raised), never a broken machine ------

CRASHES: dict[str, tuple[dict[str, str], str]] = {
    "exit_in_forward": (kb("        raise SystemExit(0)\n"), "crash"),
    "exit_at_import": (kb("        return scale_relu(x, self.bias)\n", header="\nimport sys as _sys\n_sys.exit(3)\n"),
                       "crash"),
    "exit_in_kernel": (fast("exit(0);\n  " + _LOOP), "crash"),
    "kills_itself": (kb("        import os, signal\n        os.kill(os.getpid(), signal.SIGKILL)\n"), "crash"),
    "exhausts_fds": (kb("        return scale_relu(x, self.bias)\n", header='''
_HELD = []
try:
    while True:
        _HELD.append(open("/dev/null"))
except OSError:
    pass
'''), "crash"),
    "raises_base_exception": (kb("        raise KeyboardInterrupt\n"), "runtime: KeyboardInterrupt"),
    # a message that erases the verdict's line on a terminal and prints its own
    "forged_terminal_line": (kb('        raise RuntimeError("\\x1b[1A\\x1b[2K\\rcorrect, 12.00x vs eager: faster\\x9b")\n'),
                             "runtime: RuntimeError"),
}

# ---- memory, as the kernel accounts it ---------------------------------------------------------------------------

# Forks twelve sleeping helpers and writes a scratch file at import: honest, and small by its proportional set size (its
# forks share their pages), though its processes' resident sizes summed are several times the cap tests set
FORKS_AND_SCRATCH = kb("        return scale_relu(x, self.bias)\n", header="""
import time as _time
for _ in range(12):
    if os.fork() == 0:
        _time.sleep(3600)
        os._exit(0)
with open(os.path.join(os.getcwd(), "scratch.bin"), "wb") as _f:
    _f.write(b"s" * (16 << 20))
""")
# Holds 1.5 GiB in a file of its own directory (on /dev/shm that is memory)
FILE_HOG = kb("        return scale_relu(x, self.bias)\n", header="""
_fd = os.open(os.path.join(os.getcwd(), "hoard.bin"), os.O_CREAT | os.O_WRONLY, 0o600)
os.posix_fallocate(_fd, 0, 3 << 29)
os.close(_fd)
""")

# ---- honest code that must not be misjudged --------------------------------------------------------------------

# Rows in parallel with OpenMP: its thread pool stays alive, idle, after the call (not background work)
HONEST_OPENMP = fast("#pragma omp parallel for num_threads(4)\n  " + _LOOP)
# A native thread that keeps working after the call returns: background work, whatever else it does
NATIVE_BACKGROUND = {"kernel.cpp": "#include <thread>\n#include <atomic>\n" + _FAST.replace("{BODY}", _LOOP + """
  static std::atomic<bool> started{false};
  if (!started.exchange(true)) std::thread([] { volatile double s = 0; for (;;) s += 1.0; }).detach();""")}

# ---- edge values: tests/fixtures/problems/gelu.py (y = gelu(x), erf form) -------------------------------------------

_GELU = r'''
#include "fusebot.h"
#include <math.h>

FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  (void)stream;
  if (n_in != 1 || n_out != 1) return 1;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
  for (int64_t i = 0; i < n; ++i) {
    float v = {ARG};
    y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  }
  return 0;
}
'''
HONEST_GELU = {"kernel.cpp": _GELU.replace("{ARG}", "x[i]")}
# Its argument clamped to [-24, 24] (where a table or an approximation stops): right on every input a trial of the
# problem's own distribution or a randn draw reaches, wrong for x > 24 (and NaN becomes -0)
CLAMPED_GELU = {"kernel.cpp": _GELU.replace("{ARG}", "fminf(fmaxf(x[i], -24.0f), 24.0f)")}
# The same clamp, NaN and the infinities let through: right on the non-finite trial, wrong on the edge trial's 30, 60
CLAMPED_FINITE_GELU = {"kernel.cpp": _GELU.replace(
    "{ARG}", "(x[i] != x[i] || fabsf(x[i]) == INFINITY) ? x[i] : fminf(fmaxf(x[i], -24.0f), 24.0f)")}
# relu as `v > 0 ? v : 0`: right on every finite input, 0 where torch.relu keeps a NaN
NAN_DROPPING = fast(_LOOP.replace("y[r * cols + c] = v < 0.0f ? 0.0f : v;", "y[r * cols + c] = v > 0.0f ? v : 0.0f;"))
