"""What a kernel was verified on, for its PR and its manifest: each shape set's input shapes and dtypes, the output
dtypes and the tolerance the harness applied to them.

The problem is user code, so it never runs in the runner's own process: `verified_inputs(spec)` runs
`python -m runner.results.shapes SPEC.json` under runner.harness.sandbox, which loads the problem the way the
harness does (runner.harness.problem: the same factories and dtype) and builds its inputs and outputs under a
FakeTensorMode (shapes without memory). A problem that cannot be described gets an empty description, never an
exception: the harness has already verified it, this only names what it verified.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from runner.contract import DEFAULT_TOLERANCE, ProblemSpec
from runner.harness.sandbox import describe_problem

log = logging.getLogger(__name__)

OUTPUT_FILE = "verified.json"


def verified_inputs(spec: ProblemSpec, *, timeout_s: float = 120.0) -> dict:
    """{"shape_sets": [{"inputs": [{"shape": [..], "dtype": "float32"}, ...], "outputs": [...]}, ...],
    "atol": .., "rtol": ..} or {} when the problem cannot be described."""
    return describe_problem(spec, "runner.results.shapes", OUTPUT_FILE, "verified inputs", timeout_s) or {}


def tolerance(spec: ProblemSpec, output_dtypes: list[str]) -> tuple[float, float]:
    """The loosest (atol, rtol) the harness applied over the outputs (runner.harness.verify.tolerance_for): the
    problem's own where it sets one, else each output dtype's default."""
    dtypes = [d for d in output_dtypes if d in DEFAULT_TOLERANCE] or [spec.dtype or "float32"]
    atol = spec.atol if spec.atol is not None else max(DEFAULT_TOLERANCE[d][0] for d in dtypes)
    rtol = spec.rtol if spec.rtol is not None else max(DEFAULT_TOLERANCE[d][1] for d in dtypes)
    return atol, rtol


def shapes_text(verified: dict) -> str:
    """"(4096, 1024) float32; (17, 1000) float32" (one entry per shape set, its tensor inputs), or ""."""
    sets = []
    for s in verified.get("shape_sets", []):
        ins = [f"({', '.join(map(str, t['shape']))}) {t['dtype']}" for t in s.get("inputs", [])]
        if ins:
            sets.append(" + ".join(ins))
    return "; ".join(sets)


_NUMBER_DTYPES = {"bool": "bool", "int": "int64", "float": "float32"}  # a Python number as the kernel ABI takes it


def _abi_inputs(inputs: list, model) -> list[dict] | None:
    """The kernel ABI's inputs of a call (runner/csrc/fusebot.h): the forward's arguments, a number as a 0-dim
    tensor, then the model's parameters and buffers in state_dict order; None for an argument of another kind."""
    import torch  # noqa: PLC0415

    out = []
    for x in [*inputs, *model.state_dict(keep_vars=True).values()]:
        if isinstance(x, torch.Tensor):
            out.append({"shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch.")})
        elif type(x).__name__ in _NUMBER_DTYPES:
            out.append({"shape": [], "dtype": _NUMBER_DTYPES[type(x).__name__]})
        else:
            return None
    return out


def calls(verified: dict) -> list[dict]:
    """The verified calls as runner.harness.launch_plan.record takes them ([] where a set lacks its ABI inputs or
    outputs)."""
    out = []
    for s in verified.get("shape_sets", []):
        if not s.get("abi_inputs") or not s.get("outputs"):
            return []
        out.append({"inputs": [[t["dtype"], t["shape"]] for t in s["abi_inputs"]],
                    "outputs": [[t["dtype"], t["shape"]] for t in s["outputs"]]})
    return out


def _describe(spec: ProblemSpec) -> dict:
    import torch  # only the confined child needs torch  # noqa: PLC0415
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415

    from runner.harness.problem import build_model, load, make_inputs  # imports torch: the child's alone

    problem = load(spec)
    model = build_model(problem, problem.model_cls, 0, "cpu")
    sets, out_dtypes = [], []
    with FakeTensorMode(allow_non_fake_inputs=True):
        for shape_set in range(problem.shape_sets()):
            inputs = make_inputs(problem, 0, shape_set=shape_set, randn=None, device="cpu")
            entry = {"inputs": [{"shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch.")}
                                for x in inputs if isinstance(x, torch.Tensor)], "outputs": [],
                     "abi_inputs": _abi_inputs(inputs, model)}
            try:
                out = model(*inputs)
                outs = list(out) if isinstance(out, tuple | list) else [out]
                entry["outputs"] = [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
                                    for t in outs if isinstance(t, torch.Tensor)]
            except Exception as exc:  # noqa: BLE001 - the forward is user code; the description goes without outputs
                log.info("outputs of shape set %d not described: %s", shape_set, exc)
            out_dtypes += [o["dtype"] for o in entry["outputs"]]
            sets.append(entry)
    atol, rtol = tolerance(spec, out_dtypes)
    return {"shape_sets": sets, "atol": atol, "rtol": rtol}


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    spec_path = Path(argv[0])
    spec = ProblemSpec.model_validate_json(spec_path.read_text())
    (spec_path.parent / OUTPUT_FILE).write_text(json.dumps(_describe(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
