"""The `rowblock` access: an input constant inside a row over runs of elements (a GroupNorm's per-channel weight over
its group's rows) is read once per run-aligned vector from a per-row base, not through the general broadcast index."""

from __future__ import annotations

import shutil
import subprocess
from math import prod

import pytest

from runner.catalog.codegen.index import division_fns, rowblock_index_fns
from runner.catalog.ir import Input, Load, Op, Program, Red


def _prog(x_shape, w_shape, axes) -> Program:
    x, w = Load(0), Load(1)
    out = Op("mul", (Op("sub", (x, Red("mean", x))), w))
    return Program(inputs=[Input(0, x_shape, "float32"), Input(1, w_shape, "float32")], out=out, shape=x_shape,
                   axes=axes, out_shape=x_shape)


@pytest.mark.parametrize(("x_shape", "w_shape", "axes", "kind", "run"), [
    ((112, 8, 8, 262144), (8, 8, 1), (2, 3), "rowblock", 262144),  # GroupNorm: a weight per channel of a group
    ((1024, 16, 512, 1), (16, 512, 1), (2, 3), "rowblock", 1),  # GroupNorm after a GEMM: one per element of a row
    ((6, 4, 5), (4, 1), (1, 2), "rowblock", 5),  # no outer variation: only runs inside the row
    ((6, 4, 5), (6, 1, 1), (1, 2), "outer", None),
    ((6, 4, 5), (4, 5), (1, 2), "rowvec", None),
    ((6, 4, 5), (1, 5), (1, 2), "rowper", 5),  # varies along the row's last dim only: repeats every 5
    ((32768, 32768), (32768,), (0, 1), "rowper", 32768),  # a hinge loss's targets in a whole-tensor mean
    ((2, 3, 4, 5), (4, 5), (1, 2, 3), "rowper", 20),
    ((6, 4, 5), (6, 1, 5), (1, 2), "general", None),  # ... and outside the row
    ((6, 4, 5, 3), (4, 1, 3), (1, 2), "general", None),  # varies along an inner dim
    ((6, 4, 5, 3), (5, 3), (1, 2), "general", None),
])
def test_inputs_constant_over_runs_of_a_row_are_rowblock(x_shape, w_shape, axes, kind, run):
    p = _prog(x_shape, w_shape, axes)
    assert p.access(1) == kind
    if kind == "rowblock":
        assert p.block_len(1) == run
    if kind == "rowper":  # its period inside the row
        c = p.period_split(1)
        assert c is not None and prod(x_shape[c:axes[-1] + 1]) == run


NO_FIXED_SIZES = "FB_HD long long fb_fc(int d) { (void)d; return 0; }\n"
HOST_MULHI = """static unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64); }"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_the_gpu_run_division_matches_integer_division(tmp_path):
    """fb_rbq's device branch (multiply-high and shift with fb_set_runs's magic numbers) compiled for the host with a
    host __umulhi: equal to r / L for run lengths up to 2^31 - 1 and positions up to 2^31 - 1; fb_rper's r % L."""
    fns = (NO_FIXED_SIZES + division_fns() + rowblock_index_fns()).replace("FB_HD", "static inline")
    src = f"""#include <cstdio>
#define __CUDA_ARCH__ 900
#define FB_ND 1
{HOST_MULHI}
struct FbArgs {{ int a0; long long F[1]; long long st[1][1]; unsigned bL[1], bM[1]; int bS[1];
                 unsigned long long fM[1]; int fS[1]; }};
{fns}
int main() {{
  const long long Ls[] = {{1, 2, 3, 5, 7, 63, 64, 65, 255, 480, 1000003, 262144, 262147, (1LL << 30) + 3,
                          0x7fffffffLL}};
  FbArgs a = {{}};
  long long bad = 0, checked = 0;
  for (long long L : Ls) {{
    fb_set_runs(a, 0, L);
    for (long long r = 0; r < 0x7fffffffLL; r = r < 5000 ? r + 1 : r * 2 + 7) {{
      for (long long e = -2; e <= 2; ++e) {{
        const long long q = r + e * L;
        if (q < 0 || q >= 0x7fffffffLL) continue;
        ++checked;
        if ((long long)fb_rbq(a, 0, q) != q / L || fb_rper(a, 0, q) != q % L) {{
          if (bad++ < 5) printf("L=%lld r=%lld\\n", L, q);
        }}
      }}
    }}
  }}
  printf("checked %lld bad %lld\\n", checked, bad);
  return bad != 0 || checked < 50000;
}}
"""
    (tmp_path / "div.cpp").write_text(src)
    build = subprocess.run(["g++", "-O1", "-std=c++17", "div.cpp", "-o", "div"], cwd=tmp_path, capture_output=True,
                           text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    run = subprocess.run([str(tmp_path / "div")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout[-2000:]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_a_64_bit_index_divided_through_magic_numbers_matches_integer_division(tmp_path):
    """fb_udiv's device branch (a 64-bit multiply-high, an add and a shift with fb_magic's numbers, the index
    arithmetic's only division by a run-time size) compiled for the host: equal to n / d for sizes from 1 to near
    2^63 (powers of two and their neighbours, primes, sizes of real tensors) and indices up to 2^63 - 1, at and
    around each multiple of d; fb_magic's cache gives the same numbers twice."""
    fns = (NO_FIXED_SIZES + division_fns()).replace("FB_HD", "static inline")
    src = f"""#include <cstdio>
#define __CUDA_ARCH__ 900
{HOST_MULHI}
struct FbArgs {{ long long F[1]; unsigned long long fM[1]; int fS[1]; }};
{fns}
int main() {{
  long long ds[200]; int nd = 0;
  const long long fixed[] = {{1, 3, 5, 7, 12, 96, 128256, 50257, 4095, 4097, 1000003, 2147483647LL, 2147483649LL,
                             4294967311LL, 1099511627791LL, 3074457345618258603LL, 9223372036854775783LL}};
  for (long long d : fixed) ds[nd++] = d;
  for (int s = 1; s < 63; s += 3) {{ ds[nd++] = (1LL << s) - 1; ds[nd++] = 1LL << s; ds[nd++] = (1LL << s) + 1; }}
  long long bad = 0, checked = 0;
  for (int t = 0; t < 2; ++t) for (int x = 0; x < nd; ++x) {{
    const long long d = ds[x];
    unsigned long long M; int S;
    fb_magic(d, &M, &S);
    for (unsigned long long q = 0; q < (1ULL << 63); q = q < 3000 ? q + 1 : q * 3 + 11) {{
      if (d > 1 && q > (0x7fffffffffffffffULL / (unsigned long long)d)) break;
      for (long long e = -2; e <= 2; ++e) {{
        const __int128 n = (__int128)q * d + e;
        if (n < 0 || n > 0x7fffffffffffffffLL) continue;
        ++checked;
        if (fb_udiv((long long)n, M, S) != (long long)n / d) {{ if (bad++ < 5) printf("d=%lld n=%lld\\n", d, (long long)n); }}
      }}
    }}
    if (fb_udiv(0x7fffffffffffffffLL, M, S) != 0x7fffffffffffffffLL / d) ++bad;
  }}
  printf("checked %lld bad %lld\\n", checked, bad);
  return bad != 0 || checked < 100000;
}}
"""
    (tmp_path / "div64.cpp").write_text(src)
    build = subprocess.run(["g++", "-O1", "-std=c++17", "div64.cpp", "-o", "div64"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    run = subprocess.run([str(tmp_path / "div64")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout[-2000:]
