"""Compile many rendered CUDA sources in one nvcc run: each in its own namespace with its exports renamed, so the
headers are parsed once (a compile costs 1.5-20 s on a small machine, mostly the headers)."""

from __future__ import annotations

import subprocess
from pathlib import Path

CSRC = Path(__file__).resolve().parents[4] / "runner/csrc"
# macros a source defines that the next source in the same file defines again
UNDEF = ("FB_NIN", "FB_ND", "FB_FAST", "FB_FAST_EXP", "FB_FAST_DIV", "FB_FAST_LOG", "FB_FAST_TANH", "FB_HD", "FB_M")
EXPORTS = ("fusebot_forward", "fusebot_last_error", "fusebot_set_workspace", "fusebot_workspace_need")  # renamed per source
FLAGS = ["-O3", "-std=c++17", "-arch=sm_90", "-c"]


def one_unit(sources: list[str]) -> str:
    head = [line for line in sources[0].splitlines() if line.startswith("#include")]
    parts = ["\n".join(head)]
    for k, src in enumerate(sources):
        parts.append("".join(f"#define {e} {e}_{k}\n" for e in EXPORTS) + f"namespace cand{k} {{\n{src}\n}}\n"
                     + "".join(f"#undef {m}\n" for m in (*EXPORTS, *UNDEF)))
    return "\n".join(parts)


def compile_together(sources: list[str], where: Path) -> tuple[int, str]:
    """`nvcc -O3 -std=c++17 -arch=sm_90 -c` over the sources as one translation unit: (return code, log)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "all.cu").write_text(one_unit(sources))
    p = subprocess.run(["nvcc", *FLAGS, "-I", str(CSRC), "all.cu", "-o", "all.o"], cwd=where, capture_output=True,
                       text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr
