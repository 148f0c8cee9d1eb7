"""The equivalence test a rewrite PR ships (`test_<target>.py`), as fusebot writes it: runner/results/rewrite_test.py
replaces this docstring with the PR's own and the per-PR block with the PR's values.

The module as changed against the module as it was (both loaded through the bench script beside it), on the verified
inputs and on other ranks, non-finite values, other dtypes and broadcast sizes of each input.
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
# ---- per-PR values (fusebot writes this block for each PR)
DEVICE = "cpu"
FOLDER = "target"  # the target's folder in the kernels directory
BENCH_FILE = "bench_target.py"  # the bench script beside this file, which loads both modules
# ---- end of per-PR values
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="verified on CUDA")


def _bench():
    spec = importlib.util.spec_from_file_location("fusebot_rewrite_bench_" + FOLDER, HERE / BENCH_FILE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def pair():
    bench = _bench()
    factories, mods = bench.contestants(DEVICE)
    return bench, factories, mods["PyTorch eager"], mods[bench.LABEL]


def _preconditions():
    """The preconditions the PR states on the values (fusebot.json's `preconditions`), or none."""
    try:
        return json.loads((HERE / "fusebot.json").read_text()).get("preconditions", [])
    except (OSError, ValueError):
        return []


def _variants(inputs):
    """(name, inputs) per case: each tensor input with a rank fewer and one more, an inf and a NaN in it, in
    float64 and float16, and with its first and last dims broadcast from size 1."""
    out = []
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            continue

        def put(v, i=i):
            return [v if j == i else a for j, a in enumerate(inputs)]

        out += [(f"input {i}: one dim fewer", put(x[0])), (f"input {i}: one dim more", put(x[None]))]
        if x.is_floating_point() and x.numel() > 1:
            for name, value in (("inf", float("inf")), ("NaN", float("nan"))):
                y = x.clone()
                y.view(-1)[x.numel() // 2] = value
                out.append((f"input {i}: {'an' if name == 'inf' else 'a'} {name}", put(y)))
            for dt in (torch.float64, torch.float16):
                if x.dtype != dt:
                    out.append((f"input {i}: {dt}", put(x.to(dt))))
        out.append((f"input {i}: first dim of size 1", put(x[:1])))
        out.append((f"input {i}: last dim of size 1", put(x[..., :1])))
    return out


def _call(module, inputs):
    try:
        with torch.no_grad():
            out = module(*inputs)
    except Exception as exc:  # noqa: BLE001 - the original's own refusal is what the rewrite must match
        return exc
    return out


def _same(want, got, case, finite_only=False):
    if isinstance(want, Exception) or isinstance(got, Exception):
        assert isinstance(want, Exception) and isinstance(got, Exception), (
            f"{case}: the original {'raised ' + repr(want) if isinstance(want, Exception) else 'returned'} but the "
            f"rewrite {'raised ' + repr(got) if isinstance(got, Exception) else 'returned'}")
        return
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    assert len(want) == len(got), f"{case}: {len(got)} outputs (the original: {len(want)})"
    for w, g in zip(want, got, strict=True):
        assert g.shape == w.shape, f"{case}: shape {tuple(g.shape)} (the original: {tuple(w.shape)})"
        assert g.dtype == w.dtype, f"{case}: dtype {g.dtype} (the original: {w.dtype})"
        if not finite_only:
            assert torch.equal(torch.isnan(g), torch.isnan(w)), f"{case}: NaN where the original has none, or " \
                "none where it has NaN"
            assert torch.equal(torch.isinf(g), torch.isinf(w)), f"{case}: inf where the original differs"
        finite = torch.isfinite(w)
        torch.testing.assert_close(g[finite], w[finite], msg=lambda m: f"{case}: {m}")


@pytest.mark.parametrize("seed", range(3))
def test_rewrite_matches_original_on_the_verified_inputs(pair, seed):
    bench, factories, original, rewrite = pair
    inputs = bench.make_inputs(factories, DEVICE, seed)
    _same(_call(original, inputs), _call(rewrite, inputs), f"verified inputs, seed {seed}")


def test_rewrite_matches_original_on_other_ranks_values_dtypes_and_broadcasts(pair):
    bench, factories, original, rewrite = pair
    cases = _variants(bench.make_inputs(factories, DEVICE, 0))
    assert cases, "no tensor input to vary"
    failed, preconditions = [], _preconditions()
    for case, inputs in cases:
        stated = bool(preconditions) and (case.endswith(" an inf") or case.endswith(" a NaN"))
        try:
            _same(_call(original, inputs), _call(rewrite, inputs), case, finite_only=stated)
        except AssertionError as exc:
            failed.append(str(exc).splitlines()[0])
    assert not failed, "the rewrite changes what the module does: " + "; ".join(failed)
