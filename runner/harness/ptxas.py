"""What ptxas says of each kernel of a CUDA build (nvcc `-Xptxas=-v`): registers, spills, stack, shared memory and
barriers, per entry function. It goes into the build's record (BuildInfo.kernels), the report and the next round's
prompt, so a model sees what its kernel costs in hardware, not only in milliseconds."""

from __future__ import annotations

import re

from runner.contract import KernelResources

PTXAS_VERBOSE = "-Xptxas=-v"

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


def parse(text: str) -> list[KernelResources]:
    """Each entry function's resources, in the order ptxas compiled them."""
    out: list[KernelResources] = []
    name: str | None = None
    frame: tuple[int, int, int] = (0, 0, 0)
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            name, frame = m.group(1), (0, 0, 0)
        elif (m := _FRAME.search(line)) and name is not None:
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and name is not None:
            out.append(KernelResources(name=name, registers=int(m.group(1)), barriers=int(m.group(2) or 0),
                                       shared_bytes=int(m.group(3) or 0), stack_bytes=frame[0],
                                       spill_stores_bytes=frame[1], spill_loads_bytes=frame[2]))
            name = None
    return out


def without_info(text: str) -> str:
    """The compiler's output without ptxas's per-kernel report (kept, parsed, in BuildInfo.kernels)."""
    keep = [line for line in text.splitlines()
            if not line.startswith("ptxas info") and not _FRAME.search(line)]
    return "\n".join(keep)

