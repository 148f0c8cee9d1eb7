"""The CUDA templates' parameters: a layout and the knobs the search tunes within it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CudaParams:
    layout: str = "rows"  # flat | bcast | rows | regs | columns | strided | split | cluster | grid | rope
    vec: int = 4  # elements per vector access (1 = scalar)
    threads: int = 256  # threads per block
    group: int = 0  # rows: threads per row (32 = a warp, 0 = the whole block); regs: 2-32 or 0 (the block)
    col_width: int = 32  # columns: threads across the inner dim
    slices: int = 8  # columns: threads splitting the reduced dim; split, grid: blocks per row; cluster: blocks per cluster;
    # strided: groups of the reduced dim's periods
    mode: str = "online"  # online | twopass
    grid: str = "stride"  # flat, bcast: stride (one wave of resident blocks) | once (one pass: U vectors per thread);
    # split with a per-element output: once = each row's partials merged by one small kernel, then the output pass
    # one tile of U vectors per thread per block over the row (stride: every block merges them, then walks its slice)
    fast_math: bool = False
    buffers: int = 2  # cluster, grid: 2 = the next row streams into a second buffer where two fit; 1 = one;
    # regs: 2 = the next row's vectors are loaded into a second set of registers where they fit (regs.loads_ahead)
    unroll: int = 1  # flat, bcast, split: vectors per thread per step, all loaded before any is computed;
    # columns, cluster: the reduction loops unrolled U times (loads of U steps in flight)
    interleave: bool = False  # split: a row's blocks take turns along it (block s reads tiles s, s + S, ...: all
    # of them read one window of memory at a time) instead of each walking its own contiguous chunk
    chunks: int = 1  # grid, cluster with one buffer and whole vectors: the slice's fill in K commit groups, the first
    # pass taking each part as it lands instead of waiting for the whole slice

    def label(self) -> str:
        base = f"cuda-{self.layout}-v{self.vec}-t{self.threads}"
        if self.layout in ("rows", "regs"):
            base += f"-g{self.group or self.threads}-{self.mode}"
            base += "-b1" if self.layout == "regs" and self.buffers == 1 else ""
        elif self.layout == "columns":
            base += f"-w{self.col_width}x{self.slices}-{self.mode}"
        elif self.layout == "strided":
            base += f"-g{self.slices}"
        elif self.layout == "split":
            base += f"-s{self.slices}-{self.mode}" + ("-il" if self.interleave else "") + ("-once" if self.grid == "once" else "")
        elif self.layout == "cluster":
            base += f"-c{self.slices}-{self.mode}" + ("-b1" if self.buffers == 1 else "")
            base += f"-k{self.chunks}" if self.chunks > 1 else ""
        elif self.layout == "grid":
            base += f"-s{self.slices}-{self.mode}" + ("-b1" if self.buffers == 1 else "")
            base += f"-k{self.chunks}" if self.chunks > 1 else ""
        elif self.layout != "rope":
            base += f"-{self.grid}"
        return base + (f"-u{self.unroll}" if self.unroll != 1 else "") + ("-fast" if self.fast_math else "")
