"""The arguments and outputs of every shape set of a problem, as the prompt's table shows them.

The problem is user code, so it never runs in the search's own process: `describe_inputs(spec)` runs
`python -m runner.proposers.llm.inputs SPEC.json` under runner.harness.sandbox, which loads the problem the way the
harness does (runner.harness.problem: the same factories, dtype and contiguity), its inputs under a FakeTensorMode
(shapes without memory, so 7 GB of inputs cost nothing), and writes the description beside the spec. A problem that cannot
be described gets no table (the harness will say what is wrong with it), never an exception.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
from pathlib import Path

from runner.contract import ProblemSpec
from runner.harness.sandbox import describe_problem
from runner.search.types import InputSet

log = logging.getLogger(__name__)


def describe_inputs(spec: ProblemSpec, *, timeout_s: float = 120.0) -> list[InputSet]:
    sets = describe_problem(spec, "runner.proposers.llm.inputs", "inputs.json", "inputs", timeout_s)
    return [InputSet.model_validate(s) for s in sets or []]


def _tensor(name: str, t, role: str) -> dict:
    return {"name": name, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
            "strides": list(t.stride()), "role": role}


def _describe(spec_path: Path) -> list[dict]:
    import torch  # only the confined child needs torch: the prompt builder stays torch-free
    from torch._subclasses.fake_tensor import FakeTensorMode

    from runner.harness.problem import build_model, load, make_inputs  # imports torch: the child's alone

    problem = load(ProblemSpec.model_validate_json(spec_path.read_text()))
    sets = []
    model = build_model(problem, problem.model_cls, 0, "cpu")  # real parameters (small beside the inputs)
    state = model.state_dict() if isinstance(model, torch.nn.Module) else {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        for shape_set in range(problem.shape_sets()):
            inputs = make_inputs(problem, 0, shape_set=shape_set, randn=None, device="cpu")
            names = [f"arg{k}" for k in range(len(inputs))]
            try:
                params = list(inspect.signature(model.forward).parameters)
                names = [params[k] if k < len(params) else names[k] for k in range(len(inputs))]
            except (TypeError, ValueError):
                pass
            tensors = [_tensor(n, x if isinstance(x, torch.Tensor) else torch.tensor(x), "input")
                       for n, x in zip(names, inputs, strict=True) if isinstance(x, torch.Tensor | int | float)]
            tensors += [_tensor(n, t, "param") for n, t in state.items()]
            try:
                out = model(*inputs)
                outs = list(out) if isinstance(out, tuple | list) else [out]
                tensors += [_tensor(f"out{k}", t, "output") for k, t in enumerate(outs) if isinstance(t, torch.Tensor)]
            except Exception as exc:  # noqa: BLE001 - the forward is user code; the table goes without outputs
                log.info("outputs of shape set %d not described: %s", shape_set, exc)
            sets.append({"shape_set": shape_set, "tensors": tensors})
    return sets


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    spec_path = Path(argv[0])
    (spec_path.parent / "inputs.json").write_text(json.dumps(_describe(spec_path)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
