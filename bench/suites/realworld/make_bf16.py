"""Write bf16/NAME.py from every fp32/NAME.py: the same problem with `DTYPE = torch.bfloat16` (inputs and weights in
bf16). Each problem file stays self-contained - the harness and the catalog's capture import it by path, the capture
from a copy of its text in a temporary folder - so the bf16 files are copies, kept in step by this script and checked
by tests/bench/test_realworld_suite.py. Run `python bench/suites/realworld/make_bf16.py` after editing an fp32 problem.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FP32_LINE = "DTYPE = torch.float32\n"
BF16_LINE = "DTYPE = torch.bfloat16\n"
FP32_ONLY: frozenset[str] = frozenset()  # problems whose library has no bf16 path (none so far)

log = logging.getLogger(__name__)


def bf16_source(fp32_source: str) -> str:
    if fp32_source.count(FP32_LINE) != 1:
        raise ValueError(f"an fp32 problem declares its dtype once, as {FP32_LINE.strip()!r}")
    return fp32_source.replace(FP32_LINE, BF16_LINE)


def expected_bf16() -> dict[str, str]:
    """bf16 file name -> its text, from the fp32 problems."""
    return {p.name: bf16_source(p.read_text()) for p in sorted((HERE / "fp32").glob("*.py")) if p.stem not in FP32_ONLY}


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = HERE / "bf16"
    out.mkdir(exist_ok=True)
    want = expected_bf16()
    for stale in sorted(set(p.name for p in out.glob("*.py")) - set(want)):
        (out / stale).unlink()
        log.info("removed bf16/%s", stale)
    for name, text in want.items():
        path = out / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            log.info("wrote bf16/%s", name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
