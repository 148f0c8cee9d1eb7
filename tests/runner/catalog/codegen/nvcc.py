"""Compile many rendered CUDA sources in one nvcc run: each in its own namespace with its exports renamed, so the
headers are parsed once (a compile costs 1.5-20 s on a small machine, mostly the headers). A failing run names the
sources its errors are in."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

CSRC = Path(__file__).resolve().parents[4] / "runner/csrc"
# macros a source defines that the next source in the same file defines again
UNDEF = ("FB_NIN", "FB_ND", "FB_FAST", "FB_FAST_EXP", "FB_FAST_DIV", "FB_FAST_LOG", "FB_FAST_TANH", "FB_HD", "FB_M")
EXPORTS = ("fusebot_forward", "fusebot_last_error", "fusebot_set_workspace", "fusebot_workspace_need")  # renamed per source
# nvcc's whole pipeline (front end, cicc, ptxas, the host compiler). Its -O is the host code's level alone: the PTX and
# the sm_90 cubin of -O0 and -O3 are byte for byte the same (nvcc 13.0, compared with --keep), and -O0 spares g++ most
# of its time (a unit of 78 sources: 93 s of host compile at -O3, 9 s at -O0).
FLAGS = ["-O0", "-std=c++17", "-arch=sm_90", "-c"]
_NAMESPACE = re.compile(r"^namespace cand(\d+) \{$")
_AT_LINE = re.compile(r"all\.cu\((\d+)\): (?:catastrophic )?error")
_IN_CAND = re.compile(r"cand(\d+)")


def one_unit(sources: list[str]) -> str:
    head = [line for line in sources[0].splitlines() if line.startswith("#include")]
    parts = ["\n".join(head)]
    for k, src in enumerate(sources):
        parts.append("".join(f"#define {e} {e}_{k}\n" for e in EXPORTS) + f"namespace cand{k} {{\n{src}\n}}\n"
                     + "".join(f"#undef {m}\n" for m in (*EXPORTS, *UNDEF)))
    return "\n".join(parts)


def failing_sources(unit: str, log: str) -> list[int]:
    """The positions, in one_unit's list, of the sources a failed compile's log blames: the front end's errors by the
    unit's line (each source sits in its namespace cand<k>), ptxas's and the assembler's by the kernel's mangled
    name (which names cand<k>)."""
    owner, k = {}, None
    for n, line in enumerate(unit.splitlines(), 1):
        m = _NAMESPACE.match(line)
        k = int(m.group(1)) if m else k
        owner[n] = k
    found = set()
    for line in log.splitlines():
        m = _AT_LINE.search(line)
        if m and owner.get(int(m.group(1))) is not None:
            found.add(owner[int(m.group(1))])
        elif "error" in line.lower():
            found.update(int(c) for c in _IN_CAND.findall(line))
    return sorted(found)


def _run(sources: list[str], where: Path, extra: tuple[str, ...]) -> tuple[int, str, str]:
    where.mkdir(parents=True, exist_ok=True)
    unit = one_unit(sources)
    (where / "all.cu").write_text(unit)
    p = subprocess.run(["nvcc", *FLAGS, *extra, "-I", str(CSRC), "all.cu", "-o", "all.o"], cwd=where,
                       capture_output=True, text=True, timeout=900)
    return p.returncode, p.stdout + p.stderr, unit


def _bisect(positions: list[int], sources: list[str], where: Path, extra: tuple[str, ...]) -> list[int]:
    """The failing sources among `positions` (which fail together), by compiling halves."""
    if len(positions) == 1:
        return positions
    half = len(positions) // 2
    out = []
    for k, part in enumerate((positions[:half], positions[half:])):
        rc, _, _ = _run([sources[i] for i in part], where / f"half{k}", extra)
        if rc != 0:
            out += _bisect(part, sources, where / f"half{k}", extra)
    return out


def _errors(log: str) -> str:
    lines = log.splitlines()
    keep = sorted({n + d for n, line in enumerate(lines) if "error" in line.lower() for d in (0, 1, 2)})
    return "\n".join(lines[n] for n in keep if n < len(lines))


def compile_together(sources: list[str], where: Path, names: list[str] | None = None,
                     extra: tuple[str, ...] = ()) -> tuple[int, str]:
    """`nvcc -O0 -std=c++17 -arch=sm_90 -c` (and `extra`) over the sources as one translation unit: (return code,
    log). A failed compile's log starts with the sources that fail, by name (`names`, else their positions): those
    its errors point at, or where they point at none (an error in the PTX), those found by compiling halves of the
    unit; then its error lines."""
    rc, log, unit = _run(sources, where, extra)
    if rc != 0:
        blamed = failing_sources(unit, log) or _bisect(list(range(len(sources))), sources, where, extra)
        log = "failed: " + ", ".join(names[k] if names else f"source {k}" for k in blamed) + "\n" + _errors(log)
    return rc, log
