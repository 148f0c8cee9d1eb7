"""The scripts a PR ships, as the modules of runner/shipped: imported and called directly, and rendered with a PR's
values (only the docstring, the per-PR block and the inlined resolver change)."""

from __future__ import annotations

import ast
import types

import pytest
import torch

from runner import shipped
from runner.harness.refs import INLINE, resolve_source
from runner.shipped import bench, dropin_tests, rewrite_tests

MODULES = ("bench", "dropin_tests", "rewrite_tests")


def _values(name: str) -> dict:
    return {const: f"v_{const}" for const in shipped.block_names(name)}


@pytest.mark.parametrize("name", MODULES)
def test_a_render_changes_the_docstring_the_block_and_the_resolver_only(name):
    text = shipped.render(name, "The PR's own words.\n", _values(name))
    tree = ast.parse(text)
    assert ast.get_docstring(tree) == "The PR's own words."
    assigned = {n.targets[0].id: n.value.value for n in tree.body
                if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Constant)}
    assert all(assigned[c] == f"v_{c}" for c in shipped.block_names(name))
    imported = {(n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
                for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}
    assert "runner" not in imported and "fusebot" not in imported  # a shipped file runs where fusebot is not installed
    source = shipped.source(name)
    if INLINE in source:
        assert text.count(resolve_source("_resolve")) == 1
    # everything after the per-PR block is the module's own text, unchanged
    assert text.split(shipped.END, 1)[1] == source.split(shipped.END, 1)[1]


def test_a_render_refuses_a_value_the_block_lacks_or_a_constant_left_unset():
    values = _values("rewrite_tests")
    with pytest.raises(KeyError, match="NOT_THERE"):
        shipped.render("rewrite_tests", "doc\n", values | {"NOT_THERE": 1})
    with pytest.raises(KeyError, match="DEVICE"):
        shipped.render("rewrite_tests", "doc\n", {k: v for k, v in values.items() if k != "DEVICE"})
    with pytest.raises(ValueError, match="triple quotes"):
        shipped.render("rewrite_tests", 'a """ b\n', values)


def test_a_block_value_keeps_its_comment_and_takes_any_repr():
    text = shipped.render("bench", "doc\n", _values("bench") | {"MODULE": "pkg.é # not a comment", "INIT_ARGS": [1, "#"]})
    assert "MODULE = 'pkg.é # not a comment'  # the original module" in text
    assert "INIT_ARGS = [1, '#']\n" in text


BEFORE = "a\nb\nc\nd\n"
AFTER = "a\nB\nc\nd\n"
DIFF = "--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"


def test_the_bench_script_takes_a_diff_back_where_the_lines_moved():
    assert bench._taken_back(DIFF, AFTER) == BEFORE
    assert bench._taken_back(DIFF, "new line\n" + AFTER) == "new line\n" + BEFORE  # a line added above since
    assert bench._taken_back(DIFF, AFTER.replace("B", "X")) is None  # changed where the diff did


def test_the_bench_script_says_why_a_host_is_too_noisy():
    quiet = {"a": {"median_ms": 1.0, "iqr_ms": 0.01}}
    assert bench.noise(quiet, [2.0, 2.02], load=0.5, cpus=2) == ""
    loud = bench.noise({"a": {"median_ms": 1.0, "iqr_ms": 0.5}}, [2.0, 3.0], load=9.0, cpus=2)
    assert "a's calls spread 50%" in loud and "rounds' speedups spread 50%" in loud and "load average of 9.0" in loud


def test_the_bench_script_judges_its_figure_against_the_prs():
    claim = {"speedup": 2.0, "low": 1.9, "high": 2.1, "rounds": 3, "margin": 0.05, "device": "H200"}
    assert bench.judge(claim, 2.05, [2.05], "").endswith("within the PR's stated spread")
    assert "OUTSIDE the PR's stated spread" in bench.judge(claim, 1.2, [1.2], "")
    assert "NOT COMPARABLE" in bench.judge(claim, 1.2, [1.2], "a load average of 9.0 on 2 CPUs")
    assert bench.judge(None, 1.2, [1.2], "").startswith("the PR's figure: not found")


def test_the_bench_script_times_a_loop_of_calls_and_names_the_shape():
    calls = []
    per_call = bench.back_to_back(lambda: calls.append(1), cuda=False, calls=7, repeats=2)
    assert len(calls) == 2 * (1 + 7) and per_call >= 0  # one warm-up call and the loop, per repeat
    assert bench.shapes_text([torch.zeros(4, 8), 3, torch.zeros(2, dtype=torch.float16)]) == \
        "(4, 8) float32, (2) float16"
    s = bench._summary([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (s["median_ms"], s["iqr_ms"], s["n"]) == (3.0, 2.0, 5)


def test_a_cuda_sample_whose_host_work_outlasted_its_lead_is_taken_again_behind_a_longer_one(monkeypatch):
    """(CUDA, faked on a clock the test moves) A call's host work takes 600 us, its warm-up's lead was 100 us: the
    sample is taken again behind a lead half as long again as the host work (900 us), and only that one is kept; a
    call whose host work fits its lead is timed once; one longer than the longest lead is retaken only up to it."""
    clock_ns = [0]

    class Event:
        def __init__(self, enable_timing=False):
            self.ns = 0

        def record(self):
            self.ns = clock_ns[0]

        def elapsed_time(self, other):
            return (other.ns - self.ns) / 1e6

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter_ns=lambda: clock_ns[0]))
    timer = bench.Timer("cpu")
    timer.cuda, timer.cycles_per_us, timer.lead_us = True, 1.0, 100.0
    spins, calls = [], []
    timer.sleep = spins.append

    def call(host_us):
        def fn():
            calls.append(host_us)
            clock_ns[0] += int(host_us * 1000)
        return fn

    assert timer.one(call(600)) == 0.6 and calls == [600, 600] and spins == [100, 900] and timer.lead_us == 900
    calls.clear()
    timer.one(call(600))
    assert calls == [600]  # within its lead now
    calls.clear()
    timer.one(call(5000))
    assert calls == [5000, 5000] and timer.lead_us == bench.Timer.MAX_LEAD_US
    timer.lead_us, timer.sleep = 1.0, None  # no spin at all (a torch without _sleep): nothing to retake behind
    calls.clear()
    timer.one(call(600))
    assert calls == [600]


def test_the_rewrite_test_varies_ranks_values_dtypes_and_broadcasts():
    cases = dict(rewrite_tests._variants([torch.ones(3, 4), 2]))
    assert cases["input 0: one dim fewer"][0].shape == (4,) and cases["input 0: one dim more"][0].shape == (1, 3, 4)
    assert torch.isinf(cases["input 0: an inf"][0]).sum() == 1 and torch.isnan(cases["input 0: a NaN"][0]).sum() == 1
    assert cases["input 0: torch.float64"][0].dtype == torch.float64
    assert cases["input 0: last dim of size 1"][0].shape == (3, 1)
    assert all(c[1] == 2 for c in cases.values())  # the other input as it was


def test_the_rewrite_test_compares_raising_shapes_dtypes_and_nans():
    x = torch.tensor([1.0, float("nan")])
    rewrite_tests._same(x, x.clone(), "same")
    rewrite_tests._same(ValueError("no"), TypeError("no"), "both raise")
    for got, words in ((ValueError("no"), "the rewrite raised"), (torch.ones(2, 1), "shape"),
                       (x.double(), "dtype"), (torch.tensor([1.0, 2.0]), "NaN where")):
        with pytest.raises(AssertionError, match=words):
            rewrite_tests._same(x, got, "case")
    rewrite_tests._same(x, torch.tensor([1.0, 2.0]), "a stated precondition", finite_only=True)


class _Original(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(4.0))

    def forward(self, x):
        return x * self.w


def _dropin(kernel) -> types.SimpleNamespace:
    """A stand-in for a drop-in module: `Model` (the default CLASS) computes `kernel(self, x)` and counts its calls."""

    class Model(_Original):
        kernel_calls = 0

        def forward(self, x):
            if torch.is_grad_enabled():
                return super().forward(x)  # gradients: the original forward, as the drop-in's guard does
            type(self).kernel_calls += 1
            return kernel(self, x)

    ref = types.SimpleNamespace(get_inputs=lambda: [torch.randn(3, 4)])
    return types.SimpleNamespace(Original=_Original, Model=Model, _ref=ref, _dense=lambda shape, stride: True)


def test_the_dropin_test_passes_a_kernel_that_matches_and_fails_one_that_does_not():
    good = _dropin(lambda m, x: x * m.w)
    dropin_tests.test_dropin_matches_original(good, 0, "get_inputs")
    dropin_tests.test_gradients_match_original(good, "get_inputs")
    with pytest.raises(AssertionError):
        dropin_tests.test_dropin_matches_original(_dropin(lambda m, x: x * m.w + 1), 0, "get_inputs")
    fallback = _dropin(lambda m, x: x * m.w)
    fallback.Model.forward = _Original.forward  # every call the original forward: the kernel never ran
    with pytest.raises(AssertionError, match="the fused kernel did not run"):
        dropin_tests.test_dropin_matches_original(fallback, 0, "get_inputs")
