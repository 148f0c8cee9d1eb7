"""Comparing a candidate's outputs with the reference's: the checks, each failure a reason naming the check.

Runs in the judge process (never in the candidate's). Outputs cross from the candidate as raw bytes plus a metadata
record that the candidate's process wrote; the metadata is checked first (structure, exact type, dtype, device,
shape, strides), then values (NaN/Inf positions, per-dtype tolerance).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from runner.contract import DEFAULT_TOLERANCE

DTYPE_NAMES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32,
                                   torch.int64, torch.int16, torch.int8, torch.uint8, torch.bool)}


def flatten(value: Any) -> tuple[list[torch.Tensor | Any], str]:
    """Outputs as a flat list plus a structure tag ('tensor', 'tuple:N', 'list:N')."""
    if isinstance(value, tuple | list):
        return list(value), f"{type(value).__name__}:{len(value)}"
    return [value], "tensor"


def describe(t: Any) -> dict:
    if not isinstance(t, torch.Tensor):
        return {"type": f"{type(t).__module__}.{type(t).__qualname__}", "tensor": False}
    return {
        "type": f"{type(t).__module__}.{type(t).__qualname__}",
        "tensor": True,
        "exact_tensor": type(t) is torch.Tensor,
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "dtype": str(t.dtype),
        "device": t.device.type,
        "contiguous": t.is_contiguous(),
        "layout": str(t.layout),
    }


def write_tensor(t: torch.Tensor, path: Path) -> None:
    """Raw bytes of `t` in logical (contiguous) order."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    raw = flat.view(torch.uint8)
    Path(path).unlink(missing_ok=True)
    if raw.numel() == 0:
        Path(path).write_bytes(b"")
        return
    # Copied straight from the device into the mapped file (in /dev/shm: memory), with no host copy in between.
    mapped = torch.UntypedStorage.from_file(str(path), shared=True, nbytes=raw.numel())
    torch.empty(0, dtype=torch.uint8).set_(mapped).copy_(raw)
    del mapped


def read_tensor(path: Path | None, meta: dict, device: str) -> torch.Tensor:
    """An output as the candidate's process sent it: a CUDA IPC record (meta["ipc"]) or a file of raw bytes."""
    dtype = DTYPE_NAMES[meta["dtype"]]
    numel = 1
    for n in meta["shape"]:
        numel *= n
    storage_dtype = torch.uint8 if dtype == torch.bool else dtype
    nbytes = numel * torch.empty((), dtype=storage_dtype).element_size()
    if meta.get("ipc"):
        from runner.harness.procs import ipc

        if int(meta["ipc"]["nbytes"]) != nbytes:
            raise ValueError(f"{meta['ipc']['nbytes']} bytes sent, expected {nbytes}")
        t = ipc.receive(meta["ipc"], device).view(storage_dtype).reshape(meta["shape"])
        return t.to(torch.bool) if dtype == torch.bool else t
    if Path(path).stat().st_size != nbytes:
        raise ValueError(f"{Path(path).name}: {Path(path).stat().st_size} bytes, expected {nbytes}")
    raw = torch.from_file(str(path), size=nbytes, dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
    t = raw.view(storage_dtype).reshape(meta["shape"])
    if dtype == torch.bool:
        t = t.to(torch.bool)
    return t.to(device)


@dataclass
class Comparison:
    passed: bool
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    mismatched: int = 0
    numel: int = 0
    reasons: list[str] = field(default_factory=list)


def check_metadata(ref: torch.Tensor, meta: dict, index: int) -> list[str]:
    where = f"output {index}"
    if not meta.get("tensor"):
        return [f"output-type: {where} is a {meta.get('type')}, not a torch.Tensor"]
    reasons = []
    if not meta.get("exact_tensor"):
        reasons.append(f"output-type: {where} is a {meta['type']} (a tensor subclass or lazy tensor), "
                       "not exactly torch.Tensor")
    if meta.get("layout") != "torch.strided":
        reasons.append(f"output-type: {where} has layout {meta.get('layout')}, not torch.strided")
    if meta["device"] != ref.device.type:
        reasons.append(f"device: {where} is on {meta['device']}, the reference's on {ref.device.type}")
    if meta["dtype"] != str(ref.dtype):
        reasons.append(f"dtype: {where} is {meta['dtype']}, the reference's is {ref.dtype}")
    if list(meta["shape"]) != list(ref.shape):
        reasons.append(f"shape: {where} has shape {tuple(meta['shape'])}, the reference's is {tuple(ref.shape)}")
    elif ref.is_contiguous() and not meta["contiguous"]:
        reasons.append(f"layout: {where} is not contiguous (strides {tuple(meta['stride'])}) "
                       "where the reference's output is")
    # A reference that returns a non-contiguous view is compared by value: its strides are an accident of how it
    # computed the result, and a kernel that writes a contiguous output computes the same tensor.
    if reasons and any(r.startswith("dtype") for r in reasons) and ref.is_floating_point():
        narrower = DTYPE_BITS.get(meta["dtype"], 64) < DTYPE_BITS.get(str(ref.dtype), 0)
        if narrower:
            reasons = [r + ": precision downgrade" if r.startswith("dtype") else r for r in reasons]
    return reasons


DTYPE_BITS = {"torch.float64": 64, "torch.float32": 32, "torch.float16": 16, "torch.bfloat16": 16}


# Normwise relative error below this is fp32's own rounding (a different order of the same fp32 sums); TF32 (10
# mantissa bits), fp16 and bf16 arithmetic show as 1e-4 and above.
FP32_ROUNDING = 1e-5
REDUCED_PRECISION = 1e-2  # and below this: bf16's epsilon is 2^-8 (3.9e-3), fp16's and TF32's 2^-10
CHUNK_ELEMENTS = 1 << 25  # compared in fp64 a chunk at a time: a 6 GB fp32 output must not need 60 GB of temporaries
ROUNDING_EVIDENCE = 16  # errors needed to tell rounding from a scale or a bias
ROUNDING_BALANCE = 0.25  # rounding errs each way at least this often (about half the time)


@dataclass
class ErrorSigns:
    """Which way a candidate's errors go, counted a chunk at a time. Rounding to a narrower format (TF32, fp16, bf16)
    errs up as often as down and away from zero as often as toward it, whatever the value; a uniform scale errs away
    from zero (or toward it) everywhere, and a bias the same way everywhere."""

    up: int = 0
    down: int = 0
    outward: int = 0
    inward: int = 0

    def add(self, err: torch.Tensor, value: torch.Tensor, finite: torch.Tensor) -> None:
        """`err`: the candidate's signed error per element; `value`: what it should have been."""
        self.up += int(((err > 0) & finite).sum())
        self.down += int(((err < 0) & finite).sum())
        away = err * value
        self.outward += int(((away > 0) & finite).sum())
        self.inward += int(((away < 0) & finite).sum())

    def like_rounding(self) -> bool:
        def balanced(a: int, b: int) -> bool:
            return a + b >= ROUNDING_EVIDENCE and min(a, b) >= ROUNDING_BALANCE * (a + b)

        return balanced(self.up, self.down) and balanced(self.outward, self.inward)


def reduced_precision(dtype: torch.dtype, norm_rel: float, signs: ErrorSigns) -> bool:
    """An fp32 (or fp64) output whose errors look like TF32, fp16 or bf16 arithmetic: about the narrower format's
    epsilon relative to the output's magnitude, and spread both ways like rounding (not a uniform scale, not a bias)."""
    return (dtype in (torch.float32, torch.float64) and FP32_ROUNDING <= norm_rel < REDUCED_PRECISION
            and signs.like_rounding())


def _chunks(ref: torch.Tensor, out: torch.Tensor):
    r, o = ref.reshape(-1), out.reshape(-1)
    for start in range(0, r.numel(), CHUNK_ELEMENTS):
        yield start, r[start:start + CHUNK_ELEMENTS].double(), o[start:start + CHUNK_ELEMENTS].double()


def compare_values(ref: torch.Tensor, out: torch.Tensor, atol: float, rtol: float, index: int) -> Comparison:
    where = f"output {index}"
    numel = ref.numel()
    if not ref.is_floating_point():
        bad = sum(int((ref.reshape(-1)[i:i + CHUNK_ELEMENTS] != out.reshape(-1)[i:i + CHUNK_ELEMENTS]).sum())
                  for i in range(0, numel, CHUNK_ELEMENTS))
        reasons = [f"mismatch: {where}: {bad} of {numel} elements differ (exact match required for {ref.dtype})"] if bad else []
        return Comparison(bad == 0, 0.0 if bad == 0 else None, None, bad, numel, reasons)
    nan_bad = poisoned = inf_bad = bad = 0
    max_abs = max_rel = 0.0
    diff_sq = ref_sq = worst_excess = 0.0
    worst: tuple[int, float, float] | None = None
    signs = ErrorSigns()
    for start, r, o in _chunks(ref, out):
        ref_nan, out_nan = torch.isnan(r), torch.isnan(o)
        nan_bad += int((ref_nan != out_nan).sum())
        poisoned += int((out_nan & ~ref_nan).sum())
        inf_bad += int(((torch.isinf(r) | torch.isinf(o)) & (r != o) & ~ref_nan & ~out_nan).sum())
        finite = torch.isfinite(r) & torch.isfinite(o)
        err = torch.where(finite, (o - r).abs(), torch.zeros_like(r))
        excess = err - (atol + rtol * r.abs())
        bad_mask = finite & (excess > 0)
        n_bad = int(bad_mask.sum())
        if n_bad:
            i = int(torch.where(bad_mask, excess, torch.full_like(r, -1.0)).argmax())
            if worst is None or float(excess[i]) > worst_excess:
                worst, worst_excess = (start + i, float(o[i]), float(r[i])), float(excess[i])
        signs.add(o - r, r, finite)
        bad += n_bad
        max_abs = max(max_abs, float(err.max()))
        max_rel = max(max_rel, float(torch.where(finite, err / r.abs().clamp_min(atol), torch.zeros_like(r)).max()))
        diff_sq += float(((o - r) * finite).square().sum())
        ref_sq += float((r * finite).square().sum())
    reasons: list[str] = []
    if poisoned:
        reasons.append(
            f"uninitialized-output: {where}: {poisoned} of {numel} elements are NaN where the reference is finite "
            "(never written: partial computation, or read from uninitialized or stolen memory)"
        )
    elif nan_bad:
        reasons.append(f"nan-mismatch: {where}: NaN positions differ at {nan_bad} elements")
    if inf_bad:
        reasons.append(f"inf-mismatch: {where}: Inf positions or signs differ at {inf_bad} elements")
    if bad:
        assert worst is not None
        i, got, want = worst
        msg = (f"mismatch: {where}: {bad} of {numel} elements outside atol={atol:g} rtol={rtol:g} "
               f"(max abs err {max_abs:.3g}; worst at flat index {i}: got {got:.6g}, expected {want:.6g})")
        norm_rel = diff_sq ** 0.5 / max(ref_sq ** 0.5, 1e-30)
        if reduced_precision(ref.dtype, norm_rel, signs) and bad < numel:
            msg += (f"; relative error {norm_rel:.2g} is typical of reduced precision (TF32, fp16 or bf16 "
                    "arithmetic inside an fp32 problem): precision downgrade beyond tolerance")
        elif ref.dtype in (torch.float32, torch.float64) and norm_rel < FP32_ROUNDING:
            msg += (f"; relative error {norm_rel:.2g} is fp32 rounding (another summation order, e.g. over a long "
                    "reduction): within fp32's own accuracy, so the problem's tolerance may be tighter than fp32 "
                    "can promise for it (a problem may set its own tolerance)")
        reasons.append(msg)
    ok = not reasons
    return Comparison(ok, max_abs, max_rel, bad + nan_bad + inf_bad, numel, reasons)


def spread_nonfinite(ref: torch.Tensor, out: torch.Tensor, reasons: list[str],
                     index: int) -> tuple[list[str], str | None]:
    """On a trial whose inputs hold NaN and infinities: `reasons` kept, or, where the only difference is that the
    module's output is non-finite at more elements than the candidate's (a matmul by a diagonal spreads a NaN along
    its column, a kernel of the same products keeps it at its element), the NaN and Inf reasons dropped and a note
    that says so. The module's NaN where the candidate holds an infinity is spreading too (an inf row of the diagonal
    meets a column the matmul made NaN: inf + NaN is NaN). Strict where the candidate is non-finite where the module
    is finite, where both are non-finite but differ otherwise (NaN for an Inf, a sign), or where a kind the module's
    output holds (NaN, +inf, -inf) is nowhere in the candidate's (a ReLU that makes a NaN 0 and keeps +inf swallowed
    the NaN)."""
    if not ref.is_floating_point():
        return reasons, None
    r, o = ref.reshape(-1), out.reshape(-1).to(ref.dtype)
    rn, on = ~torch.isfinite(r), ~torch.isfinite(o)
    both = rn & on
    differ = both & ~((r == o) | torch.isnan(r))  # (both non-finite: the module's NaN takes the candidate's either)
    kinds = (torch.isnan, lambda t: t == float("inf"), lambda t: t == float("-inf"))
    swallowed = any(bool(k(r).any()) and not bool(k(o).any()) for k in kinds)
    if swallowed or int((on & ~rn).sum()) or int(differ.sum()) or not int((rn & ~on).sum()):
        return reasons, None
    kept = [x for x in reasons if not x.startswith(("nan-mismatch", "inf-mismatch"))]
    return kept, (f"non-finite: on inputs holding NaN and infinities, output {index} is NaN or infinite at "
                  f"{int(on.sum())} elements, each where the module's is, and the module's at {int(rn.sum())}: the "
                  "module spreads them (a matmul, a reduction) where this candidate does not")


def magnitude(t: torch.Tensor) -> float:
    """The largest finite |value| of a floating output (0.0 when it has none), a chunk at a time."""
    if not t.is_floating_point() or t.numel() == 0:
        return 0.0
    flat, mag = t.detach().reshape(-1), 0.0
    for start in range(0, flat.numel(), CHUNK_ELEMENTS):
        c = flat[start:start + CHUNK_ELEMENTS]
        c = c[torch.isfinite(c)]
        if c.numel():
            lo, hi = torch.aminmax(c)
            mag = max(mag, abs(float(lo)), abs(float(hi)))
    return mag


def effective_atol(atol: float, mag: float) -> float:
    """An output whose every value is smaller than atol (softmax of uniform inputs over 393,216 columns: values near
    4e-6 under atol 1e-4) would let an all-zeros kernel pass: atol then counts in units of the output's magnitude."""
    return atol * mag if 0.0 < mag < atol else atol


SAMPLES = 65536


def sample(t: torch.Tensor) -> torch.Tensor:
    """SAMPLES evenly spaced elements (all of a smaller tensor): enough to tell one trial's result from another's."""
    flat = t.detach().reshape(-1)
    return flat[:: max(1, flat.numel() // SAMPLES)].clone()


def matches(ref: torch.Tensor, out: torch.Tensor, atol: float, rtol: float) -> bool:
    """Within tolerance, NaNs equal (used for the stale-result and determinism checks)."""
    if ref.shape != out.shape or ref.dtype != out.dtype:
        return False
    if not ref.is_floating_point():
        return bool(torch.equal(ref, out))
    return all(torch.allclose(o, r, atol=atol, rtol=rtol, equal_nan=True) for _, r, o in _chunks(ref, out))


# ---- the float64 oracle --------------------------------------------------------------------------------------------


def tolerance_for(dtype: torch.dtype, atol: float | None, rtol: float | None) -> tuple[float, float]:
    """The (atol, rtol) of an output of `dtype`: the problem's own where it sets one, else its dtype's default
    (runner.contract.DEFAULT_TOLERANCE; integer and bool outputs are compared exactly and ignore it)."""
    name = str(dtype).removeprefix("torch.")
    d_atol, d_rtol = DEFAULT_TOLERANCE.get(name, DEFAULT_TOLERANCE["float32"])
    return (atol if atol is not None else d_atol, rtol if rtol is not None else d_rtol)


def _eager_wrong(r: torch.Tensor, g: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """Where the reference `r` is non-finite and the float64 oracle `g` is not the same, and the candidate `o` is of
    the oracle's kind: finite where it is finite, the same infinity, NaN where it is NaN. There eager's own kernel is
    wrong (torch 2.13's CPU float32 GELU is NaN at +inf, where the oracle is +inf), and the oracle judges."""
    same = (r == g) | (torch.isnan(r) & torch.isnan(g))
    kind = (torch.isfinite(g) & torch.isfinite(o)) | (g == o) | (torch.isnan(g) & torch.isnan(o))
    return ~torch.isfinite(r) & ~same & kind


def compare_to_oracle(ref: torch.Tensor, oracle: torch.Tensor, out: torch.Tensor, atol: float, rtol: float,
                      index: int) -> Comparison:
    """The candidate's output `out` against the float64 oracle, allowed the reference's own error and a margin:

        |out - oracle| <= |ref - oracle| + atol + rtol * |oracle|        (every finite element)

    where `ref` is the reference in the problem's dtype (eager), so a kernel that rounds once where eager rounds
    twice passes, and one that loses more than the dtype's tolerance beyond eager's own error does not. NaN and
    Inf positions must match the reference's, except where eager is non-finite and the candidate is what the oracle
    is (_eager_wrong). `max_abs_err`/`max_rel_err` stay the differences from `ref`."""
    where = f"output {index}"
    numel = ref.numel()
    nan_bad = poisoned = inf_bad = bad = 0
    max_abs = max_rel = worst_excess = 0.0
    out_sq = ref_sq = orc_sq = 0.0
    worst: tuple[int, float, float, float] | None = None
    signs = ErrorSigns()
    ro, oo, co = ref.reshape(-1), oracle.reshape(-1), out.reshape(-1)
    for start in range(0, numel, CHUNK_ELEMENTS):
        r = ro[start:start + CHUNK_ELEMENTS].double()
        g = oo[start:start + CHUNK_ELEMENTS].double()
        o = co[start:start + CHUNK_ELEMENTS].double()
        r = torch.where(_eager_wrong(r, g, o), g, r)
        ref_nan, out_nan = torch.isnan(r), torch.isnan(o)
        nan_bad += int((ref_nan != out_nan).sum())
        poisoned += int((out_nan & ~ref_nan).sum())
        inf_bad += int(((torch.isinf(r) | torch.isinf(o)) & (r != o) & ~ref_nan & ~out_nan).sum())
        finite = torch.isfinite(r) & torch.isfinite(o) & torch.isfinite(g)
        zero = torch.zeros_like(r)
        err = torch.where(finite, (o - g).abs(), zero)
        allowed = torch.where(finite, (r - g).abs() + atol + rtol * g.abs(), zero)
        bad_mask = finite & (err > allowed)
        n_bad = int(bad_mask.sum())
        if n_bad:
            excess = torch.where(bad_mask, err - allowed, torch.full_like(r, -1.0))
            i = int(excess.argmax())
            if worst is None or float(excess[i]) > worst_excess:
                worst, worst_excess = (start + i, float(o[i]), float(g[i]), float(r[i])), float(excess[i])
        signs.add(o - g, g, finite)
        bad += n_bad
        diff = torch.where(finite, (o - r).abs(), zero)
        max_abs = max(max_abs, float(diff.max()) if diff.numel() else 0.0)
        max_rel = max(max_rel, float((diff / r.abs().clamp_min(atol)).max()) if diff.numel() else 0.0)
        out_sq += float(torch.where(finite, (o - g).square(), zero).sum())
        ref_sq += float(torch.where(finite, (r - g).square(), zero).sum())
        orc_sq += float(torch.where(finite, g.square(), zero).sum())
    reasons: list[str] = []
    if poisoned:
        reasons.append(
            f"uninitialized-output: {where}: {poisoned} of {numel} elements are NaN where the reference is finite "
            "(never written: partial computation, or read from uninitialized or stolen memory)"
        )
    elif nan_bad:
        reasons.append(f"nan-mismatch: {where}: NaN positions differ at {nan_bad} elements")
    if inf_bad:
        reasons.append(f"inf-mismatch: {where}: Inf positions or signs differ at {inf_bad} elements")
    if bad:
        assert worst is not None
        i, got, exact, eager = worst
        norm = max(orc_sq ** 0.5, 1e-30)
        out_rel, ref_rel = out_sq ** 0.5 / norm, ref_sq ** 0.5 / norm
        msg = (f"mismatch: {where}: {bad} of {numel} elements are further from the float64 oracle than the "
               f"reference in {ref.dtype} is, by more than atol={atol:g} rtol={rtol:g} (worst at flat index {i}, by "
               f"{worst_excess:.3g}: got {got:.6g}, expected {exact:.6g} (the oracle), reference {eager:.6g}; "
               f"relative error {out_rel:.2g} against the reference's {ref_rel:.2g})")
        if reduced_precision(ref.dtype, out_rel, signs) and ref_rel < FP32_ROUNDING:
            msg += ("; typical of reduced precision (TF32, fp16 or bf16 arithmetic inside an fp32 problem): "
                    "precision downgrade")
        reasons.append(msg)
    return Comparison(not reasons, max_abs, max_rel, bad + nan_bad + inf_bad, numel, reasons)
