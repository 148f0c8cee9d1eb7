"""The PTX reader of ptx.py on hand-written PTX: it finds a 64-bit division inside a loop, and only there."""

from __future__ import annotations

from tests.runner.catalog.codegen.ptx import loop_divisions, unit_of

PTX = """
.visible .entry _ZN5cand010fb_rows_v1ENS_6FbArgsE(
{
\tdiv.s64 \t%rd1, %rd2, %rd3;
$L__BB0_1:
\tmul.hi.u64 \t%rd4, %rd1, %rd5;
\trem.u64 \t%rd6, %rd4, %rd7;
\tsetp.lt.s64 \t%p1, %rd6, %rd8;
\t@%p1 bra \t$L__BB0_1;
\tdiv.u64 \t%rd9, %rd6, %rd7;
\tbra.uni \t$L__BB0_3;
$L__BB0_3:
\tret;
}
.visible .entry _ZN5cand110fb_flat_v4ENS_6FbArgsE(
{
$L__BB1_1:
\tdiv.u32 \t%r1, %r2, %r3;
\tmul.hi.s64 \t%rd1, %rd2, 7;
\t@%p1 bra \t$L__BB1_1;
\tdiv.s64 \t%rd3, %rd4, %rd5;
}
"""


def test_a_64_bit_division_counts_inside_a_loop_only():
    found = loop_divisions(PTX)
    assert found == {"_ZN5cand010fb_rows_v1ENS_6FbArgsE": ["rem.u64 \t%rd6, %rd4, %rd7;"],
                     "_ZN5cand110fb_flat_v4ENS_6FbArgsE": []}
    assert [unit_of(e) for e in found] == [0, 1]
