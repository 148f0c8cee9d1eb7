"""Rendered CUDA sources compiled to PTX in one nvcc run (tests/runner/catalog/codegen/nvcc.py's unit), and the PTX
read for what a kernel's loops do: a 64-bit integer division or remainder (`div`/`rem` `.s64`/`.u64`, a call of
several dozen instructions on the GPU) between a loop's head and its backward branch is index arithmetic the
generator was meant to keep out of loops (a loop counter, a constant size or a magic-number division instead)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.runner.catalog.codegen.nvcc import CSRC, one_unit

LABEL = re.compile(r"^\s*(\$L__\w+):")
BACK = re.compile(r"\bbra(?:\.uni)?\s+(\$L__\w+);")
DIV64 = re.compile(r"\b(?:div|rem)(?:\.full)?\.[su]64\b")
ENTRY = re.compile(r"^\.(?:visible |weak )?\.entry (\w+)\(")


def loop_divisions(ptx: str) -> dict[str, list[str]]:
    """Kernel entry -> the 64-bit div/rem instructions inside one of its loops (an instruction between a label and a
    later branch back to it); device functions are inlined into their kernels by the templates (forceinline)."""
    out: dict[str, list[str]] = {}
    entry, body = None, []

    def close() -> None:
        if entry is None:
            return
        at = {m.group(1): n for n, line in enumerate(body) if (m := LABEL.match(line))}
        loops = [(at[m.group(1)], n) for n, line in enumerate(body)
                 if (m := BACK.search(line)) and at.get(m.group(1), n + 1) <= n]
        out[entry] = [line.strip() for n, line in enumerate(body)
                      if DIV64.search(line) and any(a <= n <= b for a, b in loops)]

    for line in ptx.splitlines():
        m = ENTRY.match(line)
        if m:
            close()
            entry, body = m.group(1), []
        elif entry is not None:
            body.append(line)
    close()
    return out


def unit_of(entry: str) -> int:
    """The position, in one_unit's list, of the source that defined `entry` (its namespace cand<k>)."""
    m = re.match(r"_ZN(\d+)", entry)
    assert m, entry
    name = entry[m.end():m.end() + int(m.group(1))]
    assert name.startswith("cand"), entry
    return int(name[4:])


def compile_ptx(sources: list[str], where: Path) -> str:
    """`nvcc -O3 -std=c++17 -arch=sm_90 -ptx` over the sources as one translation unit: the PTX text."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "all.cu").write_text(one_unit(sources))
    p = subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90", "-ptx", "-I", str(CSRC), "all.cu", "-o", "all.ptx"],
                       cwd=where, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return (where / "all.ptx").read_text()


def divisions_by_source(sources: list[str], where: Path) -> dict[int, dict[str, list[str]]]:
    """Source position -> {kernel entry: its 64-bit divisions inside loops}, for those with any."""
    out: dict[int, dict[str, list[str]]] = {}
    for entry, found in loop_divisions(compile_ptx(sources, where)).items():
        if found:
            out.setdefault(unit_of(entry), {})[entry] = found
    return out
