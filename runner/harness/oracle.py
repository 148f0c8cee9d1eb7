"""The float64 oracle: the reference module itself, its parameters and floating inputs in float64, run beside the
reference in the problem's dtype. A candidate is judged by how far it is from the oracle compared with how far the
reference (eager) is (runner.harness.verify.compare_to_oracle), so bf16 and fp16 kernels are judged as what they
are: one that rounds once where eager rounds twice is more accurate, not "different".

Where float64 is impossible (a module that refuses double, an output the oracle cannot give, a problem too large
to hold twice in float64) the caller compares with the reference at the dtype's tolerance and says so.
"""

from __future__ import annotations

import copy

import torch

# Inputs and outputs of one oracle call, in float64, at most this many bytes (beside the reference's own).
MAX_ORACLE_BYTES = 8 << 30


def oracle_model(model: object) -> tuple[object | None, str | None]:
    """(a float64 copy of the reference module, None) or (None, why there is none)."""
    if not isinstance(model, torch.nn.Module):
        return None, "the reference is not a torch.nn.Module"
    try:
        return copy.deepcopy(model).double(), None
    except BaseException as exc:  # noqa: BLE001 - the user's module may refuse a copy or float64
        return None, f"the reference module cannot be made float64 ({type(exc).__name__}: {str(exc)[:200]})"


def _double_bytes(values: list) -> int:
    return sum(8 * x.numel() for x in values if isinstance(x, torch.Tensor) and x.is_floating_point())


def oracle_outputs(oracle: object, inputs: list, reference: list) -> tuple[list[torch.Tensor | None], str | None]:
    """The oracle's outputs for `inputs`, one per reference output (None where it has none for that output), and
    why it has none for some."""
    none = [None] * len(reference)
    if oracle is None:
        return none, None
    if _double_bytes(inputs) + _double_bytes(reference) > MAX_ORACLE_BYTES:
        return none, f"the problem holds more than {MAX_ORACLE_BYTES >> 30} GiB in float64"
    args = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else
            x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    try:
        with torch.no_grad():
            out = oracle(*args)
    except BaseException as exc:  # noqa: BLE001 - the module may refuse float64 inputs (a dtype check, a kernel)
        return none, f"the reference refused float64 ({type(exc).__name__}: {str(exc)[:200]})"
    flat = list(out) if isinstance(out, tuple | list) else [out]
    if len(flat) != len(reference):
        return none, "the reference in float64 returned another structure"
    result: list[torch.Tensor | None] = []
    for o, r in zip(flat, reference, strict=True):
        fits = isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor) and o.shape == r.shape
        result.append(o.double() if fits and r.is_floating_point() and o.is_floating_point() else None)
    missing = [i for i, (o, r) in enumerate(zip(result, reference, strict=True))
               if o is None and isinstance(r, torch.Tensor) and r.is_floating_point()]
    return result, (f"the reference in float64 gave no matching output {missing}" if missing else None)
