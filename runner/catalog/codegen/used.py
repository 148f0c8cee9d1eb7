"""Only the C a source uses: the reduction accumulators (one struct each) and helper functions cut into named pieces,
each emitted where the rest of the source names it (a kernel without a reduction carries no accumulator)."""

from __future__ import annotations

import re

# (no apostrophe inside: code_key finds this text, repr()-quoted, inside a drop-in source, and repr() escapes one
# differently inside a longer string)
ACCUMULATORS = r"""
struct AccSum { fb_acc s;
  FB_M void init() { s = 0; }
  FB_M void add(float x, long long) { s += x; }
  FB_M void merge(const AccSum& o) { s += o.s; } };
struct AccProd { fb_acc p;
  FB_M void init() { p = 1; }
  FB_M void add(float x, long long) { p *= x; }
  FB_M void merge(const AccProd& o) { p *= o.p; } };
struct AccMax { float m;
  FB_M void init() { m = -INFINITY; }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // the larger, NaN where either is: one instruction, where the comparisons below take four (the PTX spelt through
  // FB_PTX: this block holds no quote)
#ifndef FB_PTX
#define FB_PTX(...) #__VA_ARGS__
#endif
  FB_M void add(float x, long long) { asm(FB_PTX(max.NaN.f32 %0, %0, %1;) : FB_PTX(+f)(m) : FB_PTX(f)(x)); }
#else
  FB_M void add(float x, long long) { m = (x > m || x != x) ? x : m; }
#endif
  FB_M void merge(const AccMax& o) { add(o.m, 0); } };
struct AccMin { float m;
  FB_M void init() { m = INFINITY; }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#ifndef FB_PTX
#define FB_PTX(...) #__VA_ARGS__
#endif
  FB_M void add(float x, long long) { asm(FB_PTX(min.NaN.f32 %0, %0, %1;) : FB_PTX(+f)(m) : FB_PTX(f)(x)); }
#else
  FB_M void add(float x, long long) { m = (x < m || x != x) ? x : m; }
#endif
  FB_M void merge(const AccMin& o) { add(o.m, 0); } };
struct AccArgMax { float v; int i;  // an index along the reduced dims (the set-up refuses rows of 2^31 or more)
  FB_M void init() { v = -INFINITY; i = -1; }  // i < 0: nothing seen yet
  // add: a thread sees its elements in increasing j, so a tie keeps the first (no index compare per element); selects,
  // not a branch, so the compiler can issue the loads of an unrolled loop before it uses any (measured: a branch here kept
  // one load in flight per thread)
  FB_M void add(float x, long long j) {
    const bool t = (x > v) | ((x != x) & (v == v)) | ((x == v) & (i < 0)); v = t ? x : v; i = t ? (int)j : i; }
  FB_M void merge(const AccArgMax& o) {
    if (o.i < 0) return;
    if (i < 0 || o.v > v || (o.v == v && o.i < i) || (o.v != o.v && (v == v || o.i < i))) { v = o.v; i = o.i; } } };
struct AccArgMin { float v; int i;  // an index along the reduced dims (the set-up refuses rows of 2^31 or more)
  FB_M void init() { v = INFINITY; i = -1; }  // i < 0: nothing seen yet
  // add: a thread sees its elements in increasing j, so a tie keeps the first (no index compare per element); selects,
  // not a branch, so the compiler can issue the loads of an unrolled loop before it uses any (measured: a branch here kept
  // one load in flight per thread)
  FB_M void add(float x, long long j) {
    const bool t = (x < v) | ((x != x) & (v == v)) | ((x == v) & (i < 0)); v = t ? x : v; i = t ? (int)j : i; }
  FB_M void merge(const AccArgMin& o) {
    if (o.i < 0) return;
    if (i < 0 || o.v < v || (o.v == v && o.i < i) || (o.v != o.v && (v == v || o.i < i))) { v = o.v; i = o.i; } } };
struct AccLse { float m; fb_acc s;
  FB_M void init() { m = -INFINITY; s = 0; }
  FB_M void add(float x, long long) {
    // the term of a new maximum is exp(x - x): 1, or NaN at x = +inf, as exp(max - max) in the two-pass form (and the
    // log-softmax of torch is NaN on a row holding +inf); the select sits on the rare rescale branch
    if (x > m) { s = s * (fb_acc)fb_exp(m - x) + (x == INFINITY ? (fb_acc)NAN : (fb_acc)1); m = x; }
    else if (x != -INFINITY) { s += (fb_acc)fb_exp(x - m); } }
  FB_M void merge(const AccLse& o) {
    if (o.m == -INFINITY) return;
    if (o.m > m) { s = s * (fb_acc)fb_exp(m - o.m) + o.s; m = o.m; } else { s += o.s * (fb_acc)fb_exp(o.m - m); } } };
struct AccWelford { fb_acc n, mean, m2;
  FB_M void init() { n = 0; mean = 0; m2 = 0; }
  // on the GPU the step of the mean, d / n, through the fast reciprocal (2 instructions, not an IEEE division per element:
  // the step is small against the mean, so its last-bit error is far below the rounding of the sum itself)
#ifdef __CUDA_ARCH__
  FB_M void add(float x, long long) { n += 1; fb_acc d = x - mean; mean += __fdividef(d, n); m2 += d * (x - mean); }
#else
  FB_M void add(float x, long long) { n += 1; fb_acc d = x - mean; mean += d / n; m2 += d * (x - mean); }
#endif
  // on chip, the values of one thread in two local passes instead (no division per element): add_sum over them,
  // then center(), then add_dev over them again; the result is the same triple, merged as usual
  FB_M void add_sum(float x) { n += 1; mean += x; }
  FB_M void center() { if (n > 0) mean = mean / n; m2 = 0; }
  FB_M void add_dev(float x) { fb_acc d = x - mean; m2 += d * d; }
  FB_M void merge(const AccWelford& o) {
    if (o.n == 0) return;
    if (n == 0) { n = o.n; mean = o.mean; m2 = o.m2; return; }
    // one reciprocal per merge (fast on the GPU, as in add): the merges of a block sit where its memory pipe waits
    fb_acc t = n + o.n, d = o.mean - mean, w = o.n * fb_rcp(t);
    mean += d * w; m2 += o.m2 + d * d * n * w; n = t; } };
"""


def pieces(text: str) -> dict[str, str]:
    """A block of C definitions cut at each top-level one (`struct X`, `FB_HD T x(`, `static T x(`), keyed by name; a
    comment line just above a definition goes with it."""
    out: dict[str, str] = {}
    name, lines = "", []
    pending: list[str] = []
    for line in text.strip("\n").split("\n"):
        m = re.match(r"(?:struct (\w+)|(?:FB_HD|static) [\w ]+? (\w+)\()", line)
        if line.startswith("//"):
            pending.append(line)
            continue
        if m:
            if name:
                out[name] = "\n".join(lines) + "\n"
            name, lines = m.group(1) or m.group(2), [*pending, line]
        else:
            lines += [*pending, line]
        pending = []
    if name:
        out[name] = "\n".join(lines + pending) + "\n"
    return out


ACC_STRUCTS = pieces(ACCUMULATORS)  # AccSum, AccMax, ...: each struct's text


def used(parts: dict[str, str], code: str) -> str:
    """The pieces `code` names, with the pieces those name in turn, in their own order (no dead definitions)."""
    keep: set[str] = set()
    todo = [code]
    while todo:
        text = todo.pop()
        for name, body in parts.items():
            if name not in keep and re.search(rf"\b{name}\b", text):
                keep.add(name)
                todo.append(body)
    return "".join(body for name, body in parts.items() if name in keep)


def accumulators(code: str) -> str:
    """The accumulator structs `code` (the rest of a source) uses."""
    return "\n" + used(ACC_STRUCTS, code)
